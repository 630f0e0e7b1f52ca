# `cmake --install build --prefix DIR` installs baton's headers, libraries and
# a CMake package, so that a driver outside this tree builds with
#   find_package(baton CONFIG REQUIRED)
#   target_link_libraries(my_driver PRIVATE baton::workers)
# (tests/install/ builds such a project against an install on every run).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(BATON_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/baton)
set(BATON_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/baton)

set(_baton_exported baton_torch)
if(TARGET baton_arrow)
  list(APPEND _baton_exported baton_arrow)
endif()
foreach(m IN ITEMS base net runtime dispatch engine text data algos rewards tools workers trainer)
  if(NOT TARGET baton_${m})
    continue()
  endif()
  list(APPEND _baton_exported baton_${m})
  if(NOT TARGET baton::${m})
    add_library(baton::${m} ALIAS baton_${m})
  endif()
  set_target_properties(baton_${m} PROPERTIES EXPORT_NAME ${m})
  # Headers are included as "runtime/baton.h": the source (and build) tree's
  # root while building, include/baton in an install.
  get_target_property(_dirs baton_${m} INTERFACE_INCLUDE_DIRECTORIES)
  set(_wrapped "")
  foreach(d IN LISTS _dirs)
    if(d MATCHES "^\\$<")
      list(APPEND _wrapped "${d}")
    elseif(d)
      list(APPEND _wrapped "$<BUILD_INTERFACE:${d}>")
    endif()
  endforeach()
  list(APPEND _wrapped "$<INSTALL_INTERFACE:${BATON_INSTALL_INCLUDEDIR}>")
  set_target_properties(baton_${m} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_wrapped}")
endforeach()
# The public headers: each module's folder as it is in the tree (algos and
# rewards are under workers/), less what is internal: runtime/internal/ (the
# transport, codec, wire schema, worker host), the cluster's relay and agent
# protocol, the rendezvous store's server and protocol. InstallTest checks
# that none of these is installed.
foreach(d IN ITEMS base net runtime dispatch engine text data workers trainer)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${d}/ DESTINATION ${BATON_INSTALL_INCLUDEDIR}/${d}
          FILES_MATCHING PATTERN "*.h"
          PATTERN "internal" EXCLUDE
          PATTERN "relay.h" EXCLUDE
          PATTERN "agent_protocol.h" EXCLUDE
          PATTERN "store_protocol.h" EXCLUDE
          PATTERN "store_server.h" EXCLUDE)
endforeach()

install(TARGETS ${_baton_exported} EXPORT batonTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT batonTargets NAMESPACE baton:: DESTINATION ${BATON_INSTALL_CMAKEDIR})
# The node agent every node of a multi-node job runs (runtime/cluster/cluster.h).
install(TARGETS baton-agent RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(EXISTS ${PROJECT_SOURCE_DIR}/configs)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/configs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/baton/configs)
endif()

# The package config finds what the libraries need, starting with the very
# LibTorch baton was built against.
set(BATON_NVCC_USED "$ENV{CUDACXX}")
if(TARGET baton_data)
  set(BATON_HAS_DATA TRUE)
else()
  set(BATON_HAS_DATA FALSE)
endif()
if(TARGET baton_trainer)
  set(BATON_HAS_TRAINER TRUE)
else()
  set(BATON_HAS_TRAINER FALSE)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/batonConfig.cmake.in
  ${PROJECT_BINARY_DIR}/batonConfig.cmake INSTALL_DESTINATION ${BATON_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/batonConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/batonConfig.cmake ${PROJECT_BINARY_DIR}/batonConfigVersion.cmake
        DESTINATION ${BATON_INSTALL_CMAKEDIR})
