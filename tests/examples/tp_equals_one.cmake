# A tensor-parallel run (SPLIT: e.g. --nproc 2 --tp 2 over Gloo processes, or pipeline stages of
# tensor-parallel ranks) ends its epoch with one process's losses and accuracy, to the printed
# digits (test_vit_tensor_parallel proves the numbers on threads; this, the example's wiring).
# ONE is the one-process run (--backend local --nproc 1, with the global batch where the split
# run's replicas take --batch-size each).
#   cmake -DPROGRAM=fashion_mnist -DARGS="common;args" -DSPLIT="split;args" -DONE="one;args" [-DBEFORE="args"]
#         -P tp_equals_one.cmake
function(epoch_line out)
  execute_process(COMMAND ${PROGRAM} ${ARGS} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e TIMEOUT 300)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "exit status ${rc}: ${PROGRAM} ${ARGS} ${ARGN}\n${o}${e}")
  endif()
  if(NOT "${o}${e}" MATCHES "epoch 1/1 +(train_loss [0-9.]+ +test_loss [0-9.]+ +test_accuracy [0-9.]+)")
    message(FATAL_ERROR "no epoch line: ${PROGRAM} ${ARGS} ${ARGN}\n${o}${e}")
  endif()
  set(${out} "${CMAKE_MATCH_1}" PARENT_SCOPE)
  message(STATUS "${ARGN}: ${CMAKE_MATCH_1}")
endfunction()
# BEFORE: a run made first (e.g. an --export that SPLIT and ONE start from).
if(DEFINED BEFORE)
  epoch_line(before ${BEFORE})
endif()
epoch_line(tp ${SPLIT})
epoch_line(one ${ONE})
if(NOT tp STREQUAL one)
  message(FATAL_ERROR "${SPLIT}: '${tp}', one process: '${one}'")
endif()
