# LibTorch for every baton target: the one in PyPI's torch wheel, installed in
# the project's venv by scripts/setup_python.sh (a CUDA build, so the NCCL and
# CUDA path — BATON_CUDA — compiles and links in every build, GPU or not).
#
# Supported: LibTorch 2.11 to 2.15 (the venv pins 2.15; GPU machines often
# ship 2.11, and scripts/check_torch_headers.sh compiles every module against
# its headers). Another LibTorch in that range: pass -DTorch_DIR=... (or
# CMAKE_PREFIX_PATH), or -DBATON_PYTHON=<a python with torch>, and
# -DBATON_CUDA=OFF when it is a CPU-only build.

option(BATON_CUDA "Compile the CUDA/NCCL path (needs a CUDA LibTorch and nvcc)" ON)

if(DEFINED ENV{BATON_VENV})
  set(_baton_default_python "$ENV{BATON_VENV}/bin/python")
else()
  set(_baton_default_python "/opt/baton-venv/bin/python")
endif()
set(BATON_PYTHON "${_baton_default_python}" CACHE FILEPATH
    "Python of the venv whose torch wheel provides LibTorch (scripts/setup_python.sh)")

if(NOT Torch_DIR AND EXISTS "${BATON_PYTHON}")
  execute_process(
    COMMAND "${BATON_PYTHON}" -c
      "import os, torch.utils; print(torch.utils.cmake_prefix_path + ';' + os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE _baton_torch_prefix
    RESULT_VARIABLE _baton_torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _baton_torch_rc EQUAL 0)
    message(FATAL_ERROR "baton: ${BATON_PYTHON} cannot import torch; run scripts/setup_python.sh")
  endif()
  # Both the CMake package and the wheel's torch/ root: Torch's config looks its
  # libraries up with find_library, which would otherwise take a system
  # LibTorch's (Debian's libtorch-dev, say) before the wheel's.
  list(PREPEND CMAKE_PREFIX_PATH ${_baton_torch_prefix})
elseif(Torch_DIR)
  # Reconfiguring (or a Torch_DIR given): its LibTorch root is three levels up.
  get_filename_component(_baton_torch_root "${Torch_DIR}/../../.." ABSOLUTE)
  list(PREPEND CMAKE_PREFIX_PATH "${_baton_torch_root}")
endif()

if(BATON_CUDA)
  # Torch's config enables the CUDA language. Without an architecture list it
  # probes the installed GPUs (none here), and CMake 3.25 then fails to test
  # nvcc 13 for the C++20 dialect; 9.0 (Hopper) is what a user would build for.
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
  endif()
  if(NOT DEFINED ENV{CUDACXX} AND NOT CMAKE_CUDA_COMPILER)
    find_program(BATON_NVCC nvcc HINTS /usr/local/cuda/bin ENV CUDA_HOME PATH_SUFFIXES bin)
    if(NOT BATON_NVCC)
      message(FATAL_ERROR "baton: BATON_CUDA is ON but nvcc was not found (set CUDACXX, "
                          "or configure with -DBATON_CUDA=OFF for a CPU-only LibTorch)")
    endif()
    set(ENV{CUDACXX} "${BATON_NVCC}")
  endif()
endif()

find_package(Torch QUIET)
if(NOT Torch_FOUND)
  message(FATAL_ERROR "baton: LibTorch not found. Run scripts/setup_python.sh (it installs "
                      "PyPI's torch into ${BATON_PYTHON}), or pass -DTorch_DIR=<LibTorch>/share/cmake/Torch")
endif()
if(Torch_VERSION VERSION_LESS 2.0)
  message(FATAL_ERROR "baton: needs LibTorch 2.11 to 2.15, found ${Torch_VERSION} in ${Torch_DIR}")
endif()
if(Torch_VERSION VERSION_LESS 2.11 OR Torch_VERSION VERSION_GREATER_EQUAL 2.16)
  message(WARNING "baton: supports LibTorch 2.11 to 2.15; ${Torch_VERSION} in ${Torch_DIR} "
                  "is outside that range and may not compile")
endif()
message(STATUS "baton: LibTorch ${Torch_VERSION} from ${Torch_DIR} (supported: 2.11 to 2.15)")
# Two LibTorches in one process crash at start-up: every library must be the
# package's own.
foreach(_baton_lib IN ITEMS TORCH_LIBRARY c10_LIBRARY C10_CUDA_LIBRARY)
  if(${_baton_lib} AND NOT ${_baton_lib} MATCHES "^${TORCH_INSTALL_PREFIX}/")
    message(FATAL_ERROR "baton: ${_baton_lib} is ${${_baton_lib}}, not in the LibTorch at "
                        "${TORCH_INSTALL_PREFIX} (another LibTorch is installed on the system). "
                        "Configure from an empty build directory, or pass -D${_baton_lib}=...")
  endif()
endforeach()

if(BATON_CUDA)
  if(NOT TARGET torch_cuda)
    message(FATAL_ERROR "baton: BATON_CUDA is ON but the LibTorch in ${Torch_DIR} has no CUDA "
                        "(configure with -DBATON_CUDA=OFF for a CPU-only build)")
  endif()
  # libtorch_cuda needs the NCCL, cuBLAS, cuDNN... of the nvidia-* wheels beside
  # it, not an older copy the system may have: link and run against those
  # (baton::torch below carries the flags).
  # A wheel's Torch_DIR is <site-packages>/torch/share/cmake/Torch.
  get_filename_component(_baton_site "${Torch_DIR}/../../../.." ABSOLUTE)
  if(EXISTS "${_baton_site}/nvidia")
    file(GLOB BATON_NVIDIA_LIB_DIRS LIST_DIRECTORIES true "${_baton_site}/nvidia/*/lib")
  endif()
endif()

# baton::torch — what a target needs to use LibTorch: its libraries, its
# compile flags (the C++ ABI), BATON_CUDA, and the run path to the wheel's
# CUDA libraries. Every module links it instead of ${TORCH_LIBRARIES}, and the
# installed package exports it, so a user's driver gets the same.
add_library(baton_torch INTERFACE)
add_library(baton::torch ALIAS baton_torch)
set_target_properties(baton_torch PROPERTIES EXPORT_NAME torch)
target_link_libraries(baton_torch INTERFACE ${TORCH_LIBRARIES})
separate_arguments(_baton_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(baton_torch INTERFACE ${_baton_torch_flags})
if(BATON_CUDA)
  target_compile_definitions(baton_torch INTERFACE BATON_CUDA=1 USE_C10D_NCCL)
  foreach(dir IN LISTS BATON_NVIDIA_LIB_DIRS)
    target_link_options(baton_torch INTERFACE "LINKER:-rpath-link,${dir}" "LINKER:-rpath,${dir}")
  endforeach()
endif()
