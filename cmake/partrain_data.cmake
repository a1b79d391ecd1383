# partrain::data: the data layer's link needs. The headers are in partrain::partrain; the IDX reader
# (partrain/data/idx.hpp and what includes it) inflates gzip files with zlib, so its users link
# partrain::data, which brings ZLIB::ZLIB. Left out, with one line saying so, when zlib is missing.
find_package(ZLIB QUIET)
if(ZLIB_FOUND)
  add_library(partrain_data INTERFACE)
  add_library(partrain::data ALIAS partrain_data)
  target_link_libraries(partrain_data INTERFACE partrain ZLIB::ZLIB)
  set(PARTRAIN_HAVE_ZLIB ON)
  message(STATUS "partrain: zlib found, partrain::data (IDX reader) enabled")
else()
  set(PARTRAIN_HAVE_ZLIB OFF)
  message(STATUS "partrain: zlib not found, partrain::data (IDX reader) is left out (install zlib1g-dev)")
endif()
