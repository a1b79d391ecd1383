# A tensor-parallel run (SPLIT: e.g. --nproc 2 --tp 2 over Gloo processes, or pipeline stages of
# tensor-parallel ranks) ends its epoch with one process's losses and accuracy, to the printed
# digits (test_vit_tensor_parallel proves the numbers on threads; this, the example's wiring).
# ONE is the one-process run (--backend local --nproc 1, with the global batch where the split
# run's replicas take --batch-size each).
#   cmake -DPROGRAM=fashion_mnist -DARGS="common;args" -DSPLIT="split;args" -DONE="one;args" [-DBEFORE="args"]
#         -P tp_equals_one.cmake
include(${CMAKE_CURRENT_LIST_DIR}/example_capture.cmake)
function(epoch_line out)
  run_capture(line "epoch 1/1 +(train_loss [0-9.]+ +test_loss [0-9.]+ +test_accuracy [0-9.]+)" "no epoch line" ${ARGN})
  set(${out} "${line}" PARENT_SCOPE)
  message(STATUS "${ARGN}: ${line}")
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
