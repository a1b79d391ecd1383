# Install rules: headers, one export set per part, a config that finds the optional engines again
# on the consumer's machine (nothing machine-specific is written into the package).
include(CMakePackageConfigHelpers)
set(partrain_cmake_dir ${CMAKE_INSTALL_DATADIR}/cmake/partrain)

install(DIRECTORY ${partrain_include_dir}/partrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# The core target, and each backend in its own export set: the config includes a backend's
# targets only when its engine is found, so a host-only consumer never needs CUDA or Gloo.
install(TARGETS partrain EXPORT partrain-targets)
install(EXPORT partrain-targets NAMESPACE partrain:: DESTINATION ${partrain_cmake_dir})
export(EXPORT partrain-targets NAMESPACE partrain:: FILE ${CMAKE_CURRENT_BINARY_DIR}/partrain-targets.cmake)
set(PARTRAIN_INSTALLED_COMPONENTS "")
foreach(part data gloo mpi cuda nccl)
  if(TARGET partrain_${part})
    set_target_properties(partrain_${part} PROPERTIES EXPORT_NAME ${part})  # partrain::${part}
    install(TARGETS partrain_${part} EXPORT partrain-${part}-targets)
    install(EXPORT partrain-${part}-targets NAMESPACE partrain:: DESTINATION ${partrain_cmake_dir})
    list(APPEND PARTRAIN_INSTALLED_COMPONENTS ${part})
  endif()
endforeach()

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/partrainConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/partrainConfig.cmake
  INSTALL_DESTINATION ${partrain_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/partrainConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/partrainConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/partrainConfigVersion.cmake
  ${CMAKE_CURRENT_LIST_DIR}/FindNCCL.cmake
  DESTINATION ${partrain_cmake_dir})
