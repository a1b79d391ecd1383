# Warnings are errors in our own targets; sanitizers when asked for.
add_library(partrain_warnings INTERFACE)
target_compile_options(partrain_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>
  $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)
if(PARTRAIN_SANITIZE)
  string(REPLACE ";" "," _partrain_san "${PARTRAIN_SANITIZE}")
  target_compile_options(partrain_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${_partrain_san} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(partrain_warnings INTERFACE -fsanitize=${_partrain_san})
endif()
