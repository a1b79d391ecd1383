# Warnings are errors in our own targets; sanitizers when asked for.
add_library(partrain_warnings INTERFACE)
target_compile_options(partrain_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>
  $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)
# GCC 12 with optimisation reports false positives from inside libstdc++: -Wrestrict in string
# concatenation ("a" + str), -Wstringop-overflow in std::fill/memset, -Wmaybe-uninitialized on
# std::optional (GCC bugs 105329, 105545, 105651). They stay visible as warnings, not errors; so
# under nvcc, whose host compiler is the C++ one (an optimised CUDA build of the example hit the
# first).
target_compile_options(partrain_warnings INTERFACE
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-error=restrict;-Wno-error=stringop-overflow;-Wno-error=maybe-uninitialized>
  $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Xcompiler=-Wno-error=restrict,-Wno-error=stringop-overflow,-Wno-error=maybe-uninitialized>)
if(PARTRAIN_SANITIZE)
  string(REPLACE ";" "," _partrain_san "${PARTRAIN_SANITIZE}")
  target_compile_options(partrain_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${_partrain_san} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(partrain_warnings INTERFACE -fsanitize=${_partrain_san})
endif()
