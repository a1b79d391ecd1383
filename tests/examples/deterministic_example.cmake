# --deterministic S: the same global batches trained at world sizes 1, 2 and 3 (threads) and 2
# (gloo processes, where built) end with the same final parameter checksum, as do ZeRO-1 at 2 and
# 3, ZeRO-2 in small buckets at 3 (threads, and MPI processes where MPIEXEC is given), the global
# batch in 2 or 3 accumulated batches, and ZeRO-1 and FSDP runs saved at 2 ranks and resumed at 3; FSDP's
# own checksum at 1, 2 and 3 ranks (threads, gloo, MPI); the CNN and the ViT under DDP and FSDP
# at 1 to 3 ranks, threads and processes; the plain DDP run at world 2 must not
# (or the test would pass without the mode doing anything).
#   cmake -DPROGRAM=fashion_mnist -DARGS="common;args" -DCKPT=dir [-DGLOO=1] [-DMPIEXEC="mpiexec;flags"]
#         -P deterministic_example.cmake
include(${CMAKE_CURRENT_LIST_DIR}/example_capture.cmake)
function(checksum out)
  run_capture(sum "final parameter checksum ([0-9a-f]+)" "no final parameter checksum" ${ARGN})
  set(${out} ${sum} PARENT_SCOPE)
endfunction()

# The run ARGN (after ARGS) must end at `want`, the 1-rank checksum of its mode and model.
function(expect want)
  checksum(got ${ARGN})
  if(NOT got STREQUAL want)
    string(REPLACE ";" " " run "${ARGN}")
    message(FATAL_ERROR "${run} ended at ${got}, one rank at ${want}")
  endif()
endfunction()
# The same under mpirun -np 3 (MPIEXEC: the launcher and its flags), where MPI is built.
function(expect_mpi want)
  if(DEFINED MPIEXEC)
    set(PROGRAM ${MPIEXEC} -np 3 ${PROGRAM})
    expect(${want} --backend mpi ${ARGN})
  endif()
endfunction()
set(two --backend local --nproc 2)  # two processes: gloo where built, else threads
if(GLOO)
  set(two --backend gloo --nproc 2)
endif()

checksum(one --backend local --nproc 1 --deterministic 6)
expect(${one} --backend local --nproc 2 --deterministic 6)
expect(${one} --backend local --nproc 3 --deterministic 6)
expect(${one} ${two} --deterministic 6)
# ZeRO-1 (the optimizer state sharded over the ranks) at 2 and 3 ranks; ZeRO-2 (the exact sum
# reduce-scattered 64 KiB at a time: 29 buckets a step at 3 ranks) at 3 threads and 3 MPI processes.
expect(${one} --backend local --nproc 2 --deterministic 6 --parallel zero1)
expect(${one} --backend local --nproc 3 --deterministic 6 --parallel zero1)
expect(${one} --backend local --nproc 3 --deterministic 6 --parallel zero2 --bucket-kb 64)
expect_mpi(${one} --deterministic 6 --parallel zero2 --bucket-kb 64)
# Gradient accumulation: the global batch of 60 as 2 batches of 30 (3 shards each) at 2 ranks, and
# as 3 of 20 (2 shards each) at 3 ranks under ZeRO-1, the same bits (a later --batch-size wins).
expect(${one} --backend local --nproc 2 --deterministic 6 --batch-size 30 --accumulate 2)
expect(${one} --backend local --nproc 3 --deterministic 6 --batch-size 20 --accumulate 3 --parallel zero1)
message(STATUS "ddp, zero1 and zero2 at 1 to 3 ranks, threads and processes, accumulating or not: ${one}")
# FSDP (the layers sharded, each unit's shard gradients summed in exact bins: bits of its own) at 1
# and 3 threads, 2 threads in 2 accumulated batches, 2 processes and 3 MPI ones.
checksum(fsdp_one --backend local --nproc 1 --deterministic 6 --parallel fsdp)
expect(${fsdp_one} --backend local --nproc 3 --deterministic 6 --parallel fsdp)
expect(${fsdp_one} --backend local --nproc 2 --deterministic 6 --parallel fsdp --batch-size 30 --accumulate 2)
expect(${fsdp_one} ${two} --deterministic 6 --parallel fsdp)
expect_mpi(${fsdp_one} --deterministic 6 --parallel fsdp)
message(STATUS "fsdp at 1 to 3 ranks, threads and processes, accumulating or not: ${fsdp_one}")
# The CNN and the ViT: DDP at 1 thread and 2 processes, FSDP at 1 and 3 threads and 2 processes,
# each model's own bits.
foreach(model cnn vit)
  checksum(ddp_1 --model ${model} --backend local --nproc 1 --deterministic 6)
  expect(${ddp_1} --model ${model} ${two} --deterministic 6)
  checksum(fsdp_1 --model ${model} --backend local --nproc 1 --deterministic 6 --parallel fsdp)
  expect(${fsdp_1} --model ${model} --backend local --nproc 3 --deterministic 6 --parallel fsdp)
  expect(${fsdp_1} --model ${model} ${two} --deterministic 6 --parallel fsdp)
  message(STATUS "${model}: DDP ${ddp_1}, FSDP ${fsdp_1} at every world size")
endforeach()
if(NOT DEFINED CKPT)
  message(FATAL_ERROR "pass -DCKPT=dir for the checkpoint runs")
endif()
string(REPLACE "--epochs;2" "--epochs;1" first "${ARGS}")
# The first epoch of ARGS, run ARGN, saved into a fresh CKPT.
function(first_epoch)
  file(REMOVE_RECURSE ${CKPT})
  execute_process(COMMAND ${PROGRAM} ${first} ${ARGN} --checkpoint ${CKPT}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e TIMEOUT 300)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " run "${ARGN}")
    message(FATAL_ERROR "the first epoch of ${run} failed (${rc}):\n${o}${e}")
  endif()
endfunction()
# Saved at 2 ranks after the first epoch, resumed at 3: the 1-rank run's bits (ZeRO-1's whole
# optimizer state resliced; FSDP's sharded checkpoint read at another world size).
first_epoch(--backend local --nproc 2 --deterministic 6 --parallel zero1)
expect(${one} --backend local --nproc 3 --deterministic 6 --parallel zero1 --checkpoint ${CKPT})
first_epoch(--backend local --nproc 2 --deterministic 6 --parallel fsdp)
expect(${fsdp_one} --backend local --nproc 3 --deterministic 6 --parallel fsdp --checkpoint ${CKPT})
message(STATUS "zero1 and fsdp saved at 2 ranks and resumed at 3: ${one}, ${fsdp_one}")
# A checkpoint of the replicated optimizer (no --parallel zero1) is refused by ZeRO-1, by name.
first_epoch(--backend local --nproc 2 --deterministic 6)
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
