# `cmake --install` rules: the headers under <prefix>/include/zero (by layer: core/, autograd/, nn/,
# optim/, distributed/ with its comm/, zero/ and run/), one static library per layer under <prefix>/lib
# (libzero_core.a ... libzero_distributed_run.a), and the CMake package "zero" so that another project
# can write
#
#   find_package(zero REQUIRED)                 # -DCMAKE_PREFIX_PATH=<prefix>
#   target_link_libraries(app PRIVATE zero::zero)
#
# The package config (cmake/zeroConfig.cmake.in) finds the libraries zero links publicly again with
# find_dependency: Eigen3, OpenMP, MPI, fmt, nlohmann_json, and CUDAToolkit + NCCL when the CUDA
# backend was built.
include(CMakePackageConfigHelpers)

set(ZERO_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/zero CACHE STRING
    "Where the CMake package files of zero are installed, relative to the prefix")

# zero is an interface target that links the layers' libraries, as in the build tree.
install(TARGETS zero ${ZERO_LIBRARIES} EXPORT zeroTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
foreach(layer core autograd nn optim distributed)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zero/${layer}
          FILES_MATCHING PATTERN "*.h" PATTERN "*.def")
endforeach()
install(EXPORT zeroTargets NAMESPACE zero:: DESTINATION ${ZERO_INSTALL_CMAKEDIR})

# Values the config needs at find time (see its header).
set(ZERO_PACKAGE_WITH_CUDA ${ZERO_WITH_CUDA})
set(ZERO_PACKAGE_NCCL_DIR "")
if(ZERO_WITH_CUDA)
  get_filename_component(ZERO_PACKAGE_NCCL_DIR "${ZERO_NCCL_LIBRARY}" DIRECTORY)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zeroConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/zeroConfig.cmake
                              INSTALL_DESTINATION ${ZERO_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zeroConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zeroConfig.cmake ${PROJECT_BINARY_DIR}/zeroConfigVersion.cmake
        DESTINATION ${ZERO_INSTALL_CMAKEDIR})
