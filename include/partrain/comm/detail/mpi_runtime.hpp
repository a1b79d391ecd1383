// partrain/comm/detail/mpi_runtime.hpp: MPI itself, once per process. Initialises MPI on first
// use (at least MPI_THREAD_SERIALIZED: every group calls MPI from its own progress thread, and
// one process-wide mutex keeps those calls apart), finalises it at exit when partrain was the one
// that initialised it, maps dtypes to MPI types and makes the reduction MPI lacks (16-bit floats).
#pragma once

#if !__has_include(<mpi.h>)
#error "partrain/comm/mpi.hpp needs MPI (Debian libopenmpi-dev); link partrain::mpi"
#endif

#include <array>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

#include <mpi.h>

#include <partrain/comm/detail/host_reduce.hpp>
#include <partrain/comm/reduce_op.hpp>
#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/half.hpp>

namespace partrain::inline v0::detail::mpi {

// Set by the launchers a rank of an MPI job runs under: mpirun (Open MPI), srun and other PMI
// launchers, PMIx servers.
[[nodiscard]] inline bool launched() noexcept {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (std::getenv(v)) return true;
  }
  return false;
}

[[nodiscard]] inline std::string error_string(int code) {
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int len = 0;
  if (MPI_Error_string(code, text.data(), &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text.data(), static_cast<std::size_t>(len));
}

template <class T, reduce_op Op>
void user_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_typed(static_cast<T*>(inout), static_cast<const T*>(in), static_cast<std::size_t>(*len), Op);
}

class runtime {
 public:
  // The process's runtime; initialises MPI on the first call.
  [[nodiscard]] static runtime& instance() {
    static runtime r;
    return r;
  }
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;

  // Every MPI call of partrain holds it (the thread level may be only SERIALIZED).
  [[nodiscard]] std::mutex& mutex() noexcept { return mutex_; }

  [[nodiscard]] static MPI_Datatype type_of(dtype t) noexcept {
    switch (t) {
      case dtype::float32: return MPI_FLOAT;
      case dtype::float64: return MPI_DOUBLE;
      case dtype::int32: return MPI_INT32_T;
      case dtype::int64: return MPI_INT64_T;
      case dtype::uint8: return MPI_UINT8_T;
      case dtype::float16: case dtype::bfloat16: return MPI_UINT16_T;  // moved as bits, reduced by our ops
    }
    return MPI_DATATYPE_NULL;
  }

  // MPI's op, or ours where MPI has no type for the data (avg: a sum, divided afterwards).
  [[nodiscard]] MPI_Op op_of(dtype t, reduce_op op) const noexcept {
    const bool is16 = t == dtype::float16 || t == dtype::bfloat16;
    const std::size_t k = op_index(op);
    if (is16) return t == dtype::float16 ? half_ops_[k] : bf16_ops_[k];
    constexpr std::array<MPI_Op, 4> builtin{MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX};
    return builtin[k];
  }

  // Ends the whole job: every rank of MPI_COMM_WORLD, as mpirun tears it down.
  [[noreturn]] static void abort_job(std::string_view why) noexcept {
    std::fprintf(stderr, "partrain: %.*s\npartrain: aborting the MPI job (MPI_Abort) so that no rank hangs\n",
                 static_cast<int>(why.size()), why.data());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();  // MPI_Abort does not return; this is for the compiler
  }

 private:
  runtime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (initialized) {
      MPI_Query_thread(&provided);  // the user's MPI: theirs to finalise
    } else {
      // Open MPI's non-blocking all_reduce (libnbc) picks a binomial tree for few ranks, which
      // measured 0.45-0.5 of the blocking MPI_Allreduce at every size here (bench_collectives);
      // Rabenseifner's reduce-scatter + all-gather reaches 0.9-1.0 of it. A user's own setting
      // (environment or mpirun --mca) wins.
      ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
      if (int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided); rc != MPI_SUCCESS) {
        throw config_error("MPI_Init_thread failed: " + error_string(rc));
      }
      owned_ = true;
    }
    if (provided < MPI_THREAD_SERIALIZED) {
      throw config_error("the mpi backend needs MPI at MPI_THREAD_SERIALIZED or higher (it calls MPI from a "
                         "progress thread), but MPI was initialised at level " + std::to_string(provided) +
                         (initialized ? "; call MPI_Init_thread with MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE"
                                      : ""));
    }
    // Errors come back as codes, so they reach our error types instead of aborting in MPI.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    make_ops<half>(half_ops_);
    make_ops<bfloat16>(bf16_ops_);
  }
  ~runtime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto* ops : {&half_ops_, &bf16_ops_}) {
      for (auto& o : *ops) MPI_Op_free(&o);
    }
    if (owned_) MPI_Finalize();
  }

  static constexpr std::size_t op_index(reduce_op op) noexcept {
    switch (op) {
      case reduce_op::sum: case reduce_op::avg: return 0;
      case reduce_op::prod: return 1;
      case reduce_op::min: return 2;
      case reduce_op::max: return 3;
    }
    return 0;
  }
  template <class T>
  static void make_ops(std::array<MPI_Op, 4>& ops) {
    MPI_Op_create(&user_reduce<T, reduce_op::sum>, 1, &ops[0]);
    MPI_Op_create(&user_reduce<T, reduce_op::prod>, 1, &ops[1]);
    MPI_Op_create(&user_reduce<T, reduce_op::min>, 1, &ops[2]);
    MPI_Op_create(&user_reduce<T, reduce_op::max>, 1, &ops[3]);
  }

  std::mutex mutex_;
  bool owned_ = false;
  std::array<MPI_Op, 4> half_ops_{};
  std::array<MPI_Op, 4> bf16_ops_{};
};

}  // namespace partrain::inline v0::detail::mpi
