# Apache Arrow and Parquet for reading verl's parquet prompt files
# (data/parquet_file.h): the C++ libraries inside PyPI's pyarrow wheel, in the
# same venv as torch (scripts/setup_python.sh pins it), linked as LibTorch is
# from torch's wheel. Without pyarrow in BATON_PYTHON's environment the build
# goes on without Parquet (BATON_PARQUET off; reading one says how to get it).
#
# baton::arrow carries the include directory, the two libraries (the wheel
# ships them versioned only, libarrow.so.<N>) and their run path.
set(BATON_PARQUET OFF)
if(EXISTS "${BATON_PYTHON}")
  execute_process(
    COMMAND "${BATON_PYTHON}" -c
      "import pyarrow; print(pyarrow.__version__); print(pyarrow.get_include()); print(pyarrow.get_library_dirs()[0])"
    OUTPUT_VARIABLE _baton_arrow_out
    RESULT_VARIABLE _baton_arrow_rc
    ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_baton_arrow_rc EQUAL 0)
    string(REPLACE "\n" ";" _baton_arrow_out "${_baton_arrow_out}")
    list(GET _baton_arrow_out 0 BATON_ARROW_VERSION)
    list(GET _baton_arrow_out 1 _baton_arrow_include)
    list(GET _baton_arrow_out 2 _baton_arrow_libdir)
    file(GLOB _baton_libarrow "${_baton_arrow_libdir}/libarrow.so.[0-9]*")
    file(GLOB _baton_libparquet "${_baton_arrow_libdir}/libparquet.so.[0-9]*")
    list(FILTER _baton_libarrow EXCLUDE REGEX "\\.so\\.[0-9]+\\.")
    list(FILTER _baton_libparquet EXCLUDE REGEX "\\.so\\.[0-9]+\\.")
    if(_baton_libarrow AND _baton_libparquet AND EXISTS "${_baton_arrow_include}/parquet/arrow/reader.h")
      set(BATON_PARQUET ON)
    endif()
  endif()
endif()

if(BATON_PARQUET)
  add_library(baton_arrow INTERFACE)
  add_library(baton::arrow ALIAS baton_arrow)
  set_target_properties(baton_arrow PROPERTIES EXPORT_NAME arrow)
  target_include_directories(baton_arrow SYSTEM INTERFACE "${_baton_arrow_include}")
  target_link_libraries(baton_arrow INTERFACE ${_baton_libparquet} ${_baton_libarrow})
  target_link_options(baton_arrow INTERFACE "LINKER:-rpath,${_baton_arrow_libdir}")
  message(STATUS "baton: Parquet through pyarrow ${BATON_ARROW_VERSION}'s Arrow (${_baton_arrow_libdir})")
else()
  message(STATUS "baton: no pyarrow in ${BATON_PYTHON}: Parquet prompt files are not supported")
endif()
