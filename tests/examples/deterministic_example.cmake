# --deterministic S: the same global batches trained at world sizes 1, 2 and 3 (threads) and 2
# (gloo processes, where built) end with the same final parameter checksum, as do ZeRO-1 at 2 and
# 3, ZeRO-2 in small buckets at 3 (threads, and MPI processes where MPIEXEC is given), the global batch in 2 or 3 accumulated batches, and a ZeRO-1 run saved at 2 ranks and resumed
# at 3; the plain DDP run at world 2 must not (or the test would pass without the mode doing
# anything).
#   cmake -DPROGRAM=fashion_mnist -DARGS="common;args" -DCKPT=dir [-DGLOO=1] [-DMPIEXEC="mpiexec;flags"]
#         -P deterministic_example.cmake
include(${CMAKE_CURRENT_LIST_DIR}/example_capture.cmake)
function(checksum out)
  run_capture(sum "final parameter checksum ([0-9a-f]+)" "no final parameter checksum" ${ARGN})
  set(${out} ${sum} PARENT_SCOPE)
endfunction()

checksum(one --backend local --nproc 1 --deterministic 6)
set(runs "local 2" "local 3")
if(GLOO)
  list(APPEND runs "gloo 2")
endif()
foreach(run IN LISTS runs)
  string(REPLACE " " ";" run_args "${run}")
  list(GET run_args 0 backend)
  list(GET run_args 1 n)
  checksum(got --backend ${backend} --nproc ${n} --deterministic 6)
  if(NOT got STREQUAL one)
    message(FATAL_ERROR "--deterministic 6 over ${backend} with ${n} ranks ended at ${got}, one rank at ${one}")
  endif()
  message(STATUS "${backend} x ${n}: ${got}")
endforeach()
# ZeRO-1 (the optimizer state sharded over the ranks): the same bits at 2 and 3 ranks, and a run
# checkpointed after its first epoch at 2 ranks and resumed at 3 (ARGS trains 2 epochs; cosine
# by epoch gives epoch 0 the same rate either way).
foreach(n 2 3)
  checksum(got --backend local --nproc ${n} --deterministic 6 --parallel zero1)
  if(NOT got STREQUAL one)
    message(FATAL_ERROR "--deterministic 6 --parallel zero1 with ${n} ranks ended at ${got}, one rank at ${one}")
  endif()
endforeach()
# ZeRO-2 (the exact sum reduce-scattered 64 KiB at a time: 29 buckets a step at 3 ranks) at 3.
checksum(got --backend local --nproc 3 --deterministic 6 --parallel zero2 --bucket-kb 64)
if(NOT got STREQUAL one)
  message(FATAL_ERROR "--deterministic 6 --parallel zero2 --bucket-kb 64 with 3 ranks ended at ${got}, one rank at ${one}")
endif()
# Three MPI processes under mpirun (MPIEXEC: the launcher and its flags), ZeRO-2 in small buckets.
if(DEFINED MPIEXEC)
  set(program ${PROGRAM})
  set(PROGRAM ${MPIEXEC} -np 3 ${program})
  checksum(got --backend mpi --deterministic 6 --parallel zero2 --bucket-kb 64)
  set(PROGRAM ${program})
  if(NOT got STREQUAL one)
    message(FATAL_ERROR "--deterministic 6 --parallel zero2 under mpirun -np 3 ended at ${got}, one rank at ${one}")
  endif()
  message(STATUS "mpi x 3, zero2: ${got}")
endif()
# Gradient accumulation: the global batch of 60 as 2 batches of 30 (3 shards each) at 2 ranks, and
# as 3 of 20 (2 shards each) at 3 ranks under ZeRO-1, the same bits (a later --batch-size wins).
foreach(run "2;--batch-size;30;--accumulate;2" "3;--batch-size;20;--accumulate;3;--parallel;zero1")
  list(POP_FRONT run n)
  checksum(got --backend local --nproc ${n} --deterministic 6 ${run})
  if(NOT got STREQUAL one)
    message(FATAL_ERROR "--deterministic 6 ${run} with ${n} ranks ended at ${got}, one rank at ${one}")
  endif()
endforeach()
if(NOT DEFINED CKPT)
  message(FATAL_ERROR "pass -DCKPT=dir for the checkpoint runs")
endif()
file(REMOVE_RECURSE ${CKPT})
string(REPLACE "--epochs;2" "--epochs;1" first "${ARGS}")
execute_process(COMMAND ${PROGRAM} ${first} --backend local --nproc 2 --deterministic 6 --parallel zero1 --checkpoint ${CKPT}
                RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e TIMEOUT 300)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the first epoch at 2 ranks failed (${rc}):\n${o}${e}")
endif()
checksum(resumed --backend local --nproc 3 --deterministic 6 --parallel zero1 --checkpoint ${CKPT})
if(NOT resumed STREQUAL one)
  message(FATAL_ERROR "saved at 2 ranks, resumed at 3: ended at ${resumed}, one rank straight through at ${one}")
endif()
message(STATUS "zero1 at 2 and 3 ranks, and resumed from 2 at 3: ${one}")
# A checkpoint of the replicated optimizer (no --parallel zero1) is refused by ZeRO-1, by name.
file(REMOVE_RECURSE ${CKPT})
execute_process(COMMAND ${PROGRAM} ${first} --backend local --nproc 2 --deterministic 6 --checkpoint ${CKPT}
                RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e TIMEOUT 300)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the first epoch without zero1 failed (${rc}):\n${o}${e}")
endif()
execute_process(COMMAND ${PROGRAM} ${ARGS} --backend local --nproc 2 --deterministic 6 --parallel zero1 --checkpoint ${CKPT}
                RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e TIMEOUT 300)
if(rc EQUAL 0 OR NOT "${o}${e}" MATCHES "is not a deterministic ZeRO-1 one")
  message(FATAL_ERROR "zero1 resumed a replicated optimizer's checkpoint (exit ${rc}):\n${o}${e}")
endif()
# Without the mode, 2 ranks of half the batch each sum in another order.
checksum(plain --backend local --nproc 2)
if(plain STREQUAL one)
  message(FATAL_ERROR "plain DDP ended at the deterministic checksum ${one}: the comparison proves nothing")
endif()
message(STATUS "deterministic: ${one} at every world size; plain DDP at 2 ranks: ${plain}")
