# A slim source tarball of partrain (what a FetchContent URL consumer downloads, as nlohmann's
# json.tar.xz): CMakeLists.txt, cmake/, include/, single_include/, src/ (the compiled mode), README.md.
#   cmake -DSOURCE_DIR= -DOUTPUT=path.tar.gz -P this
get_filename_component(out_dir ${OUTPUT} DIRECTORY)
set(tree ${out_dir}/partrain-src)
file(REMOVE_RECURSE ${tree})
file(MAKE_DIRECTORY ${tree})
foreach(item CMakeLists.txt README.md)
  file(COPY ${SOURCE_DIR}/${item} DESTINATION ${tree})
endforeach()
foreach(dir cmake include single_include src)
  file(COPY ${SOURCE_DIR}/${dir} DESTINATION ${tree})
endforeach()
# Examples, benchmarks and tests are not shipped: the options that add them must not fail.
file(MAKE_DIRECTORY ${tree}/tests ${tree}/examples ${tree}/bench)
file(REMOVE ${OUTPUT})
execute_process(COMMAND ${CMAKE_COMMAND} -E tar czf ${OUTPUT} partrain-src WORKING_DIRECTORY ${out_dir}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT EXISTS ${OUTPUT})
  message(FATAL_ERROR "could not write ${OUTPUT}")
endif()
file(SIZE ${OUTPUT} size)
message(STATUS "wrote ${OUTPUT} (${size} bytes)")
