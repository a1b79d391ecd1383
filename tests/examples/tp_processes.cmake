# --tp 2 over two Gloo processes: the epoch's losses and accuracy equal one process's, to the
# printed digits (test_vit_tensor_parallel proves the numbers on threads; this, over processes).
#   cmake -DPROGRAM=fashion_mnist -DARGS="common;args" -P tp_processes.cmake
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
epoch_line(tp --nproc 2 --tp 2)
epoch_line(one --backend local --nproc 1)
if(NOT tp STREQUAL one)
  message(FATAL_ERROR "--tp 2 over 2 gloo processes: '${tp}', one process: '${one}'")
endif()
