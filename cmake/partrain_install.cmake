include(CMakePackageConfigHelpers)
install(DIRECTORY ${partrain_include_dir}/partrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(_partrain_targets partrain)
foreach(t partrain_gloo partrain_cuda partrain_nccl)
  if(TARGET ${t})
    list(APPEND _partrain_targets ${t})
  endif()
endforeach()
install(TARGETS ${_partrain_targets} EXPORT partrain-targets)
install(EXPORT partrain-targets NAMESPACE partrain:: DESTINATION ${CMAKE_INSTALL_DATADIR}/cmake/partrain)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/partrainConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/partrainConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_DATADIR}/cmake/partrain)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/partrainConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/partrainConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/partrainConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_DATADIR}/cmake/partrain)
