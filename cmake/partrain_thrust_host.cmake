# Thrust's headers for g++ (the CPU tier and bench_elementwise run the device loops on Thrust's
# sequential host system): target partrain_thrust_host, or PARTRAIN_HAVE_THRUST_HOST OFF with one
# line saying so. The CUDA toolkit's CCCL comes first, so g++ and nvcc see the same Thrust; else
# Debian's libthrust-dev (tools/setup.sh installs it where the toolkit is absent). The device
# system is set to CPP so that no Thrust header looks for the CUDA runtime.
if(NOT TARGET partrain_thrust_host)
  find_path(PARTRAIN_THRUST_INCLUDE NAMES thrust/version.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT}/include $ENV{CUDA_HOME}/include /usr/local/cuda/include
            PATH_SUFFIXES cccl NO_DEFAULT_PATH)
  find_path(PARTRAIN_THRUST_INCLUDE NAMES thrust/version.h)
  if(PARTRAIN_THRUST_INCLUDE)
    file(STRINGS ${PARTRAIN_THRUST_INCLUDE}/thrust/version.h _partrain_thrust_version REGEX "^#define THRUST_VERSION [0-9]+")
    string(REGEX REPLACE ".* ([0-9]+).*" "\\1" PARTRAIN_THRUST_VERSION "${_partrain_thrust_version}")
    add_library(partrain_thrust_host INTERFACE)
    target_include_directories(partrain_thrust_host SYSTEM INTERFACE ${PARTRAIN_THRUST_INCLUDE})
    target_compile_definitions(partrain_thrust_host INTERFACE THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP
                                                              PARTRAIN_THRUST_HOST=1)
    set(PARTRAIN_HAVE_THRUST_HOST ON)
    message(STATUS "partrain: Thrust ${PARTRAIN_THRUST_VERSION} for the CPU tier (${PARTRAIN_THRUST_INCLUDE})")
  else()
    set(PARTRAIN_HAVE_THRUST_HOST OFF)
    message(STATUS "partrain: Thrust not found, the CPU tier runs the host loops instead and reports its Thrust test "
                   "Skipped (install the CUDA toolkit or libthrust-dev)")
  endif()
elseif(NOT DEFINED PARTRAIN_HAVE_THRUST_HOST)
  set(PARTRAIN_HAVE_THRUST_HOST ON)
endif()
