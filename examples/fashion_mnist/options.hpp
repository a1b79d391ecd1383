// examples/fashion_mnist/options.hpp: the example's command line, parsed in one place. Later
// parallel modes (--parallel dp|pipeline, --devices, --stages, --micro-batches, --precision)
// are already accepted here so that adding them touches this file and the code that uses them.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace example {

// A bad command line: main prints the message and the usage, and exits with status 2.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct options {
  std::string device = "cpu";      // cpu | cuda
  std::string model = "mlp";       // mlp | cnn | vit (host layers: conv, relu, maxpool, linear; a ViT)
  std::string backend = "gloo";    // gloo | mpi | nccl | local
  std::string parallel = "ddp";    // ddp | zero1 | zero2 | fsdp | dp (one process, --devices) | pipeline (--stages ranks)
  std::string sync = "ddp";        // ddp: every step; local-sgd | diloco | powersgd: communicate less
  std::string loop = "ranges";     // ranges | coroutine | plain: three spellings of the same loop
  std::string precision = "fp32";  // fp32 | fp16 | bf16 (mixed precision: fp32 master weights)
  bool reduce_16bit = false;       // mixed precision: all_reduce gradients in the 16-bit type
  std::size_t epochs = 8;
  std::size_t batch_size = 64;     // per rank
  std::size_t accumulate = 1;      // micro-batches of batch_size per optimizer step (gradient accumulation)
  double lr = 0.05;                // 1e-3 with --optimizer adamw unless --lr is given
  bool lr_given = false;
  bool momentum_given = false;     // --momentum, which adamw does not read
  bool weight_decay_given = false; // --weight-decay, which sgd does not read
  double momentum = 0.9;
  std::string optimizer;           // sgd | adamw (default: adamw for the ViT, sgd otherwise)
  double weight_decay = 0.01;      // adamw
  std::int64_t lr_warmup = -1;     // steps of linear warm-up, then cosine by step (-1: 200 for the ViT; 0: cosine by epoch)
  std::string recompute = "none";  // none | full | every:K  (activation recomputation of the layers)
  std::uint64_t seed = 0;
  int nproc = 0;                   // 0: take rank and world size from the environment
  int devices = 2;                 // dp: host devices (worker threads) in this process
  int stages = 2;                  // pipeline: stages, one rank each
  int micro_batches = 4;           // pipeline: micro-batches per batch
  std::string schedule = "1f1b";   // pipeline: gpipe | 1f1b
  std::string checkpoint;          // directory; saved each epoch, resumed from when present
  std::string init_from;           // safetensors file: the weights loaded before training
  std::string export_to;           // safetensors file: the trained weights, written by rank 0
  std::string metrics;             // file of JSON lines: step records (every --log-every) and epoch records
  std::string trace;               // Chrome-trace JSON written by rank 0 (default: $PARTRAIN_TRACE)
  std::string data;                // Fashion-MNIST directory (default: partrain::fashion_mnist_dir())
  std::size_t limit_train = 0;     // 0 = all 60,000
  std::size_t limit_test = 0;      // 0 = all 10,000
  std::size_t log_every = 200;     // steps between progress lines (rank 0)
  bool overlap = true;             // DDP, ZeRO: start bucket all_reduces / reduce_scatters during backward
  std::string local_collectives = "inline";  // --backend local: inline (ranks' own threads, pinned) | worker
  std::size_t bucket_kb = 0;       // DDP, ZeRO: bucket size limit in KiB (0: PyTorch's 1 MiB first, 25 MiB after)
  int prefetch = -1;               // training batches assembled ahead on a loader thread (-1: see prefetch_batches)
  std::int64_t period = 8;          // local-sgd: average the parameters every N steps
  std::int64_t warmup_steps = 0;    // local-sgd: synchronous steps first
  int ranks_per_host = 0;           // local-sgd: hierarchical, hosts of N consecutive ranks (0: flat)
  std::size_t deterministic = 0;    // > 0: shards of the global batch (--batch-size); the same bits at any world size
  int tp = 1;                       // the ViT's blocks split over tensor-parallel groups of this many ranks
  bool sequence_parallel = false;   // with tp: the blocks' LayerNorms, residuals and dropout on a slice of the tokens
  std::int64_t inner_steps = 50;    // diloco: inner steps per outer step (H)
  double outer_lr = 0.7;            // diloco: outer Nesterov SGD
  double outer_momentum = 0.9;
  int outer_bits = 32;              // diloco: outer gradients exchanged in 32, 16 (bf16) or 8 bits
  std::size_t powersgd_rank = 2;    // powersgd: rank of the approximation
  std::int64_t powersgd_start = 100;  // powersgd: plain all_reduce steps first
  bool help = false;
};

inline constexpr std::string_view usage_text =
    "usage: fashion_mnist [options]\n"
    "  --device cpu|cuda         where the model runs (default cpu; cuda: the MLP under ddp, or the ViT\n"
    "                            under --parallel fsdp --backend nccl; fashion_mnist_cuda only)\n"
    "  --model mlp|cnn|vit       the MLP 784-256-128-10 (default), a CNN (conv 3x3 1->8, relu, maxpool,\n"
    "                            conv 3x3 8->16, relu, maxpool, linear 784->10) or a Vision Transformer\n"
    "                            (7x7 patches, dim 64, 4 blocks of 4 heads): one layer description\n"
    "                            that every --parallel and --sync mode trains\n"
    "  --recompute none|full|every:K  the layers' activations dropped after forward and recomputed in\n"
    "                            backward: every layer, or layers 0, K, 2K, ... (default none)\n"
    "  --backend gloo|mpi|nccl|local  communication backend (default gloo; local = threads of this process;\n"
    "                            mpi = ranks started by mpirun or srun, e.g. mpirun -np 2 fashion_mnist --backend mpi)\n"
    "  --nproc N                 start N ranks here (processes, or threads with --backend local);\n"
    "                            without it, rank and world size come from the environment (partrun, torchrun, Slurm);\n"
    "                            under partrun --spares N or --min-replicas M each process is a replica of a\n"
    "                            fault-tolerant job: a lost rank costs a step, not the job (docs/fault_tolerance.md)\n"
    "  --epochs N                (default 8)\n"
    "  --batch-size N            per rank (default 64)\n"
    "  --accumulate A            A batches per optimizer step, their gradients accumulated (default 1;\n"
    "                            not with --parallel dp or --sync local-sgd|diloco)\n"
    "  --optimizer sgd|adamw     (default adamw for --model vit, sgd otherwise)\n"
    "  --lr X                    learning rate (default 0.05 for sgd, 1e-3 for adamw)\n"
    "  --momentum X              sgd (default 0.9)\n"
    "  --weight-decay X          adamw (default 0.01)\n"
    "  --lr-warmup N             N steps of linear warm-up, then cosine by step (default 200 for --model\n"
    "                            vit; 0: cosine by epoch, the default otherwise)\n"
    "  --seed N                  weights and shuffling (default 0)\n"
    "  --loop ranges|coroutine|plain  how the loop is written (same result)\n"
    "  --no-overlap              reduce gradients after backward instead of during it\n"
    "  --local-collectives inline|worker  with --backend local: collectives on the ranks' own threads,\n"
    "                            each pinned to a core when they fill the cores (default: fastest there),\n"
    "                            or on a worker thread per rank\n"
    "  --bucket-kb N             DDP and ZeRO gradient buckets of at most N KiB (default: 1 MiB first, 25 MiB after)\n"
    "  --prefetch N              training batches assembled ahead on a loader thread, 0-64 (0: on the rank's\n"
    "                            own thread; default 0 for a rank pinned to one CPU, where a loader thread\n"
    "                            could only take turns with it, else 2)\n"
    "  --checkpoint DIR          save every epoch; resume from DIR when it holds a checkpoint\n"
    "  --tp N                    --model vit: each block's heads and MLP split over N consecutive ranks\n"
    "                            (tensor parallel), DDP (or --parallel zero1|zero2|fsdp) over the world / N\n"
    "                            groups of them; with\n"
    "                            --parallel pipeline, each of the --stages stages is N such ranks\n"
    "  --sequence-parallel       with --tp N: each rank keeps 1/N of the tokens between the blocks' matrix\n"
    "                            products (all-gathers and reduce-scatters instead of all-reduces)\n"
    "  --deterministic S         the same trained bits at any world size from 1 to S: --batch-size is then the\n"
    "                            global batch (x --accumulate), cut into S fixed shards whose gradients are\n"
    "                            summed exactly; the same bits for any --accumulate that divides S\n"
    "                            (ddp; zero1: the optimizer state sharded; zero2: the exact sum reduce-\n"
    "                            scattered a --bucket-kb bucket at a time too; fsdp: the layers sharded,\n"
    "                            each one's shard gradients summed exactly, bits of its own; host, fp32)\n"
    "  --init-from FILE          load the weights of a safetensors file (an --export of the same --model,\n"
    "                            any mode) before training; a --checkpoint to resume from wins over it\n"
    "  --export FILE             rank 0 writes the trained weights as a safetensors file (names params.<k>)\n"
    "                            (--init-from and --export: host modes other than pipeline; with --tp the\n"
    "                            whole model, its slices gathered, and --init-from slices a whole one)\n"
    "  --metrics FILE            JSON lines: a step record (loss) every --log-every steps and an epoch\n"
    "                            record: epoch, step, train_loss, test_loss, test_accuracy, samples_per_s\n"
    "  --trace FILE              timeline of every rank (Chrome trace JSON, for Perfetto or chrome://tracing);\n"
    "                            PARTRAIN_TRACE=FILE does the same\n"
    "  --data DIR                Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)\n"
    "  --limit-train N, --limit-test N  use only the first N examples (quick runs)\n"
    "  --log-every N             progress line and metrics step record every N steps (default 200,\n"
    "                            0 = none); on a terminal the progress line is redrawn in place\n"
    "  --parallel ddp|zero1|zero2|fsdp|dp|pipeline  distributed data parallel over ranks (default);\n"
    "                            ZeRO-1/2 (optimizer state, and for zero2 gradients, sharded over the\n"
    "                            ranks); fsdp (ZeRO-3: parameters too, each layer gathered around its\n"
    "                            forward and backward); data\n"
    "                            parallel over --devices N host devices of one process; or the MLP split\n"
    "                            into --stages S pipeline stages (one rank each) with --micro-batches M\n"
    "  --sync ddp|local-sgd|diloco|powersgd  with --parallel ddp: gradients all-reduced every step\n"
    "                            (default); parameters averaged every --period N steps after\n"
    "                            --warmup-steps N (post-local SGD; --ranks-per-host N: gradients\n"
    "                            averaged every step inside hosts of N ranks); DiLoCo: --inner-steps H,\n"
    "                            then an outer Nesterov step (--outer-lr X, --outer-momentum X) on\n"
    "                            outer gradients of --outer-bits 32|16|8; or PowerSGD gradients of\n"
    "                            --powersgd-rank R after --powersgd-start N plain steps\n"
    "  --devices N               dp: host devices (worker threads; default 2)\n"
    "  --stages S                pipeline: stages (default 2); --nproc defaults to S (x --tp); a multiple\n"
    "                            of that runs data-parallel replicas of the pipeline, --batch-size each\n"
    "  --micro-batches M         pipeline: micro-batches per batch (default 4)\n"
    "  --schedule gpipe|1f1b     pipeline schedule (default 1f1b)\n"
    "  --precision fp32|fp16|bf16  compute precision (default fp32); fp16 and bf16 keep fp32 master\n"
    "                            weights and a 16-bit copy; fp16 scales the loss dynamically (GradScaler);\n"
    "                            with --parallel fsdp: parameters gathered, gradients reduced in 16 bits;\n"
    "                            bf16 with --tp: the tensor-parallel collectives of the activations in bf16;\n"
    "                            the ViT with bf16: its matrix products in bf16 (fp32 accumulation)\n"
    "  --reduce-16bit            with fp16/bf16: all_reduce gradients in 16 bits (default fp32)\n";

namespace detail {

template <class T>
T parse_number(std::string_view flag, std::string_view text) {
  T v{};
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc{} || p != end) {
    throw usage_error(std::string(flag) + ": '" + std::string(text) + "' is not a valid " +
                      (std::is_floating_point_v<T> ? "number" : "non-negative integer"));
  }
  if constexpr (std::is_floating_point_v<T>) {
    // from_chars reads "inf" and "nan": neither is a learning rate or a momentum.
    if (!std::isfinite(v)) throw usage_error(std::string(flag) + ": '" + std::string(text) + "' is not a finite number");
  }
  return v;
}

inline void check_choice(std::string_view flag, const std::string& v, std::initializer_list<std::string_view> allowed) {
  for (auto a : allowed) {
    if (v == a) return;
  }
  std::string list;
  for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  throw usage_error(std::string(flag) + ": '" + v + "' is not one of: " + list);
}

}  // namespace detail

// Parses argv[1..]; throws usage_error naming the flag and what was expected.
[[nodiscard]] inline options parse_options(const std::vector<std::string>& args) {
  options o;
  std::vector<std::string> given;  // every flag, to refuse those the chosen mode would not read
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    given.push_back(flag);
    auto value = [&]() -> std::string_view {
      if (i + 1 >= args.size()) throw usage_error(flag + ": needs a value");
      return args[++i];
    };
    auto positive = [&](auto v) {
      if (v <= 0) throw usage_error(flag + ": must be greater than 0");
      return v;
    };
    if (flag == "--help" || flag == "-h") {
      o.help = true;
    } else if (flag == "--device") {
      o.device = value();
      detail::check_choice(flag, o.device, {"cpu", "cuda"});
    } else if (flag == "--model") {
      o.model = value();
      detail::check_choice(flag, o.model, {"mlp", "cnn", "vit"});
    } else if (flag == "--optimizer") {
      o.optimizer = value();
      detail::check_choice(flag, o.optimizer, {"sgd", "adamw"});
    } else if (flag == "--weight-decay") {
      o.weight_decay = detail::parse_number<double>(flag, value());
      o.weight_decay_given = true;
      if (o.weight_decay < 0) throw usage_error(flag + ": must be >= 0");
    } else if (flag == "--lr-warmup") {
      o.lr_warmup = detail::parse_number<std::int64_t>(flag, value());
      if (o.lr_warmup < 0) throw usage_error(flag + ": must be >= 0");
    } else if (flag == "--recompute") {
      o.recompute = value();
      if (o.recompute != "none" && o.recompute != "full" &&
          !(o.recompute.starts_with("every:") && o.recompute.size() > 6 &&
            o.recompute.find_first_not_of("0123456789", 6) == std::string::npos && std::stoul(o.recompute.substr(6)) > 0)) {
        throw usage_error(flag + ": '" + o.recompute + "' is not one of: none, full, every:K (K >= 1)");
      }
    } else if (flag == "--backend") {
      o.backend = value();
      detail::check_choice(flag, o.backend, {"gloo", "mpi", "nccl", "local"});
    } else if (flag == "--parallel") {
      o.parallel = value();
      detail::check_choice(flag, o.parallel, {"ddp", "zero1", "zero2", "fsdp", "dp", "pipeline"});
    } else if (flag == "--sync") {
      o.sync = value();
      detail::check_choice(flag, o.sync, {"ddp", "local-sgd", "diloco", "powersgd"});
    } else if (flag == "--period") {
      o.period = positive(detail::parse_number<std::int64_t>(flag, value()));
    } else if (flag == "--warmup-steps") {
      o.warmup_steps = detail::parse_number<std::int64_t>(flag, value());
      if (o.warmup_steps < 0) throw usage_error(flag + ": must be >= 0");
    } else if (flag == "--sequence-parallel") {
      o.sequence_parallel = true;
    } else if (flag == "--tp") {
      o.tp = positive(detail::parse_number<int>(flag, value()));
    } else if (flag == "--deterministic") {
      o.deterministic = positive(detail::parse_number<std::size_t>(flag, value()));
    } else if (flag == "--ranks-per-host") {
      o.ranks_per_host = positive(detail::parse_number<int>(flag, value()));
    } else if (flag == "--inner-steps") {
      o.inner_steps = positive(detail::parse_number<std::int64_t>(flag, value()));
    } else if (flag == "--outer-lr") {
      o.outer_lr = positive(detail::parse_number<double>(flag, value()));
    } else if (flag == "--outer-momentum") {
      o.outer_momentum = detail::parse_number<double>(flag, value());
      if (o.outer_momentum < 0 || o.outer_momentum >= 1) throw usage_error(flag + ": expected a value in [0, 1)");
    } else if (flag == "--outer-bits") {
      const std::string bits(value());
      detail::check_choice(flag, bits, {"32", "16", "8"});
      o.outer_bits = std::stoi(bits);
    } else if (flag == "--powersgd-rank") {
      o.powersgd_rank = positive(detail::parse_number<std::size_t>(flag, value()));
      if (o.powersgd_rank > 1024) throw usage_error(flag + ": at most 1024");
    } else if (flag == "--powersgd-start") {
      o.powersgd_start = detail::parse_number<std::int64_t>(flag, value());
      if (o.powersgd_start < 0) throw usage_error(flag + ": must be >= 0");
    } else if (flag == "--loop") {
      o.loop = value();
      detail::check_choice(flag, o.loop, {"ranges", "coroutine", "plain"});
    } else if (flag == "--precision") {
      o.precision = value();
      detail::check_choice(flag, o.precision, {"fp32", "bf16", "fp16"});
    } else if (flag == "--epochs") {
      o.epochs = positive(detail::parse_number<std::size_t>(flag, value()));
    } else if (flag == "--batch-size") {
      o.batch_size = positive(detail::parse_number<std::size_t>(flag, value()));
    } else if (flag == "--accumulate") {
      o.accumulate = positive(detail::parse_number<std::size_t>(flag, value()));
    } else if (flag == "--lr") {
      o.lr = positive(detail::parse_number<double>(flag, value()));
      o.lr_given = true;
    } else if (flag == "--momentum") {
      o.momentum = detail::parse_number<double>(flag, value());
      o.momentum_given = true;
      if (o.momentum < 0 || o.momentum >= 1) throw usage_error(flag + ": expected a value in [0, 1)");
    } else if (flag == "--seed") {
      o.seed = detail::parse_number<std::uint64_t>(flag, value());
    } else if (flag == "--nproc") {
      o.nproc = positive(detail::parse_number<int>(flag, value()));
    } else if (flag == "--devices") {
      o.devices = positive(detail::parse_number<int>(flag, value()));
    } else if (flag == "--stages") {
      o.stages = positive(detail::parse_number<int>(flag, value()));
    } else if (flag == "--micro-batches") {
      o.micro_batches = positive(detail::parse_number<int>(flag, value()));
    } else if (flag == "--schedule") {
      o.schedule = value();
      detail::check_choice(flag, o.schedule, {"gpipe", "1f1b"});
    } else if (flag == "--checkpoint") {
      o.checkpoint = value();
    } else if (flag == "--init-from") {
      o.init_from = value();
    } else if (flag == "--export") {
      o.export_to = value();
    } else if (flag == "--metrics") {
      o.metrics = value();
    } else if (flag == "--trace") {
      o.trace = value();
    } else if (flag == "--data") {
      o.data = value();
    } else if (flag == "--limit-train") {
      o.limit_train = positive(detail::parse_number<std::size_t>(flag, value()));
    } else if (flag == "--limit-test") {
      o.limit_test = positive(detail::parse_number<std::size_t>(flag, value()));
    } else if (flag == "--log-every") {
      o.log_every = detail::parse_number<std::size_t>(flag, value());
    } else if (flag == "--reduce-16bit") {
      o.reduce_16bit = true;
    } else if (flag == "--no-overlap") {
      o.overlap = false;
    } else if (flag == "--local-collectives") {
      o.local_collectives = value();
      detail::check_choice(flag, o.local_collectives, {"inline", "worker"});
    } else if (flag == "--prefetch") {
      o.prefetch = detail::parse_number<int>(flag, value());
      if (o.prefetch < 0 || o.prefetch > 64) {
        throw usage_error(flag + ": must be between 0 and 64, got " + std::to_string(o.prefetch));
      }
    } else if (flag == "--bucket-kb") {
      o.bucket_kb = positive(detail::parse_number<std::size_t>(flag, value()));
      // KiB to bytes must not overflow (2^54 + 1 KiB would wrap to 1 KiB buckets): at most 1 TiB.
      if (o.bucket_kb > (std::size_t{1} << 30)) throw usage_error(flag + ": at most 1073741824 (1 TiB)");
    } else {
      throw usage_error("unknown option '" + flag + "'");
    }
  }
  // A path option given an empty value would silently mean "off" or "the default": refused.
  for (const auto& [flag, v] : {std::pair<const char*, const std::string*>{"--checkpoint", &o.checkpoint},
                                {"--metrics", &o.metrics}, {"--trace", &o.trace}, {"--data", &o.data},
                                {"--init-from", &o.init_from}, {"--export", &o.export_to}}) {
    if (v->empty() && std::ranges::find(given, std::string(flag)) != given.end()) {
      throw usage_error(std::string(flag) + ": needs a non-empty path (leave the option out for its default)");
    }
  }
  // Options the chosen mode never reads are refused, not silently ignored.
  const bool ddp_buckets = (o.parallel == "ddp" || o.parallel == "zero1" || o.parallel == "zero2") &&
                           (o.sync == "ddp" || o.sync == "powersgd") && o.tp <= 1 && o.deterministic == 0;
  const struct {
    const char* flag;
    bool read;
    const char* for_whom;
  } readers[] = {
      {"--devices", o.parallel == "dp", "--parallel dp"},
      {"--stages", o.parallel == "pipeline", "--parallel pipeline"},
      {"--micro-batches", o.parallel == "pipeline", "--parallel pipeline"},
      {"--schedule", o.parallel == "pipeline", "--parallel pipeline"},
      {"--period", o.sync == "local-sgd", "--sync local-sgd"},
      {"--warmup-steps", o.sync == "local-sgd", "--sync local-sgd"},
      {"--inner-steps", o.sync == "diloco", "--sync diloco"},
      {"--outer-lr", o.sync == "diloco", "--sync diloco"},
      {"--outer-momentum", o.sync == "diloco", "--sync diloco"},
      {"--outer-bits", o.sync == "diloco", "--sync diloco"},
      {"--powersgd-rank", o.sync == "powersgd", "--sync powersgd"},
      {"--powersgd-start", o.sync == "powersgd", "--sync powersgd"},
      {"--bucket-kb", ddp_buckets || (o.deterministic > 0 && o.parallel == "zero2"),
       "DDP's and ZeRO's gradient buckets (--parallel ddp, zero1 or zero2; with --deterministic, zero2)"},
      {"--no-overlap", ddp_buckets, "DDP's and ZeRO's gradient buckets (--parallel ddp, zero1 or zero2)"},
      {"--local-collectives", o.backend == "local", "--backend local"},
      {"--sequence-parallel", o.tp > 1, "--tp N above 1"},
      {"--accumulate", o.parallel != "dp" && (o.sync == "ddp" || o.sync == "powersgd"),
       "the modes fit steps (--parallel ddp, zero1, zero2, fsdp or pipeline, --sync ddp or powersgd)"},
      // --tp above 1 outside these gets its own sentence below; --tp 1 there is a no-op.
      {"--tp", o.tp > 1 || (o.model == "vit" && o.parallel == "ddp" && o.sync == "ddp" && o.device == "cpu"),
       "--model vit with --parallel ddp on the host"},
  };
  for (const auto& r : readers) {
    if (!r.read && std::ranges::find(given, std::string(r.flag)) != given.end()) {
      throw usage_error(std::string(r.flag) + ": this run (--parallel " + o.parallel + ", --sync " + o.sync + ", --backend " +
                        o.backend + ") does not read it; it is for " + r.for_whom);
    }
  }
  // Combinations this program cannot run (yet), refused before anything starts.
  const bool zero = o.parallel == "zero1" || o.parallel == "zero2";
  // On a GPU: the MLP under DDP, the ViT under FSDP (its CUDA layers, models/vit_layers_device.hpp).
  const bool cuda_vit = o.device == "cuda" && o.model == "vit";
  if (cuda_vit && o.parallel != "fsdp") {
    throw usage_error("--device cuda --model vit: this example trains the CUDA ViT with --parallel fsdp (got --parallel " +
                      o.parallel + ")");
  }
  if (cuda_vit && o.backend != "nccl") {
    throw usage_error("--device cuda --model vit: fsdp over CUDA layers reduces on the GPU; use --backend nccl (got " +
                      o.backend + ")");
  }
  if (cuda_vit && o.recompute != "none") {
    throw usage_error("--recompute: with the host layers only (--device cpu); the CUDA ViT keeps its activations");
  }
  if (o.parallel != "ddp" && !cuda_vit) {
    if (o.device != "cpu") throw usage_error("--parallel " + o.parallel + ": this example runs it on the host (--device cpu)");
    if (!o.checkpoint.empty() && !zero && o.parallel != "fsdp" && o.parallel != "pipeline") {
      throw usage_error("--checkpoint: supported with --parallel ddp, zero1, zero2, fsdp and pipeline (not dp)");
    }
  }
  for (const auto& [flag, given] : {std::pair{"--init-from", &o.init_from}, std::pair{"--export", &o.export_to}}) {
    if (given->empty()) continue;
    if (o.parallel == "pipeline") {
      throw usage_error(std::string(flag) + ": not with --parallel pipeline (each stage holds only its own layers)");
    }
    if (o.device != "cpu") throw usage_error(std::string(flag) + ": with the host model only (--device cpu)");
  }
  if (o.sync != "ddp") {
    if (o.parallel != "ddp") throw usage_error("--sync " + o.sync + ": needs --parallel ddp");
    if (o.device != "cpu") throw usage_error("--sync " + o.sync + ": this example runs it on the host (--device cpu)");
    if (o.precision != "fp32") throw usage_error("--sync " + o.sync + ": this example runs it in fp32");
  }
  if (o.ranks_per_host > 0 && o.sync != "local-sgd") throw usage_error("--ranks-per-host: with --sync local-sgd only");
  if (o.tp > 1) {
    if (o.model != "vit") throw usage_error("--tp " + std::to_string(o.tp) + ": tensor parallel splits the ViT's blocks (use --model vit)");
    if (o.parallel == "dp" || o.sync != "ddp" || o.device != "cpu" || o.precision == "fp16" || o.deterministic > 0) {
      throw usage_error("--tp: with DDP, ZeRO or FSDP over the data-parallel dimension, or pipeline stages, on the host "
                        "in fp32 or with bf16 collectives (--parallel ddp, zero1, zero2, fsdp or pipeline, --sync ddp, "
                        "--device cpu, --precision fp32 or bf16, no --deterministic)");
    }
    if (!o.trace.empty() || o.recompute != "none") {
      throw usage_error("--tp: not yet with --trace or --recompute (each rank holds its own shard of the blocks; a "
                        "recomputed block would repeat its all-reduces)");
    }
  }
  if (o.deterministic > 0) {
    if ((o.parallel != "ddp" && o.parallel != "zero1" && o.parallel != "zero2" && o.parallel != "fsdp") || o.sync != "ddp" ||
        o.device != "cpu" || o.precision != "fp32") {
      throw usage_error("--deterministic: data parallel on the host in fp32 only (--parallel ddp, zero1, zero2 or fsdp, "
                        "--sync ddp, --device cpu, --precision fp32)");
    }
    if (o.deterministic % o.accumulate != 0) {
      throw usage_error("--deterministic " + std::to_string(o.deterministic) + " --accumulate " + std::to_string(o.accumulate) +
                        ": each batch carries whole shards, so the batches a step must divide the shards");
    }
    const std::size_t per_batch = o.deterministic / o.accumulate;
    if (o.batch_size % per_batch != 0) {
      throw usage_error("--deterministic " + std::to_string(o.deterministic) + ": with it --batch-size" +
                        (o.accumulate > 1 ? " x --accumulate" : "") + " is the global batch, and a batch of " +
                        std::to_string(o.batch_size) + " rows does not split into " + std::to_string(per_batch) +
                        " equal shards");
    }
  }
  if (o.parallel == "dp" && o.nproc > 1) {
    throw usage_error("--parallel dp drives --devices N from one process; --nproc " + std::to_string(o.nproc) +
                      " asks for several ranks (use --parallel ddp for that)");
  }
  if (o.parallel == "pipeline") {
    if (o.nproc != 0 && o.nproc % (o.stages * o.tp) != 0) {
      throw usage_error("--parallel pipeline: --nproc " + std::to_string(o.nproc) + " must be a multiple of --stages " +
                        std::to_string(o.stages) + (o.tp > 1 ? " x --tp " + std::to_string(o.tp) + " (" + std::to_string(o.tp) + " ranks per stage)"
                                                             : " (one rank per stage)") +
                        ": one pipeline, or several as data-parallel replicas");
    }
  }
  if (o.precision != "fp32" && o.parallel != "ddp" && o.parallel != "fsdp" && !zero && o.tp <= 1) {
    throw usage_error("--precision " + o.precision + ": mixed precision runs with --parallel ddp, zero1, zero2 and fsdp "
                      "(this example's dp and pipeline modes train in fp32)");
  }
  if (o.reduce_16bit && o.precision == "fp32") throw usage_error("--reduce-16bit needs --precision fp16 or bf16");
  if (o.reduce_16bit && (zero || o.parallel == "fsdp")) {
    throw usage_error("--reduce-16bit: with --parallel ddp only (ZeRO reduces in fp32; fsdp with --precision already "
                      "reduces in 16 bits)");
  }
  if (o.model != "mlp") {
    const std::string what = "--model " + o.model + ": this example's " + (o.model == "cnn" ? "CNN" : "ViT");
    if (o.device != "cpu" && !cuda_vit) throw usage_error(what + " runs on the host (--device cpu)");
    const bool vit_bf16 = o.model == "vit" && o.precision == "bf16";  // its matrix products in bf16
    if (o.precision != "fp32" && !vit_bf16 && o.parallel != "fsdp" && o.tp <= 1) {
      throw usage_error(what + " computes in fp32 (--precision " + o.precision +
                        " with --parallel fsdp gathers and reduces in 16 bits; the ViT takes --precision bf16 "
                        "everywhere: its matrix products in bf16)");
    }
  }
  if (o.recompute != "none" && o.model != "vit") {
    throw usage_error("--recompute: the " + std::string(o.model == "mlp" ? "MLP" : "CNN") +
                      "'s layers keep no activations to drop (use --model vit)");
  }
  if (o.optimizer.empty()) o.optimizer = o.model == "vit" ? "adamw" : "sgd";
  if (o.optimizer == "adamw" && o.momentum_given) {
    throw usage_error("--momentum: adamw does not read it (its moments are fixed at beta1 0.9, beta2 0.999); use --optimizer sgd");
  }
  if (o.optimizer == "sgd" && o.weight_decay_given) {
    throw usage_error("--weight-decay: sgd here does not read it; use --optimizer adamw");
  }
  if (o.optimizer == "adamw" && !o.lr_given) o.lr = 1e-3;
  if (o.lr_warmup < 0) o.lr_warmup = o.model == "vit" ? 200 : 0;
  if (o.backend == "nccl" && o.device != "cuda") throw usage_error("--backend nccl needs --device cuda");
  if (o.backend == "mpi" && o.nproc != 0) {
    throw usage_error("--backend mpi: mpirun or srun starts the ranks; run `mpirun -np " + std::to_string(o.nproc) +
                      " fashion_mnist --backend mpi ...` without --nproc");
  }
  if (o.backend == "local" && o.device == "cuda") throw usage_error("--backend local runs host ranks; use --device cpu");
  if (o.backend == "local" && o.nproc == 0) o.nproc = o.parallel == "pipeline" ? o.stages * o.tp : 1;
  return o;
}

// Training batches assembled ahead (--prefetch), by default none for a thread that may run on one
// CPU only (cpus: partrain::allowed_cpus().size(), 0 where unknown; one for a rank pinned by
// --local-collectives inline, or bound by mpirun): a loader thread there could only take turns
// with it on that CPU. Measured on the main job (2 pinned ranks on 2 cores): 2-4% more
// samples/s than with 2 batches ahead.
[[nodiscard]] inline std::size_t prefetch_batches(const options& o, std::size_t cpus) {
  if (o.prefetch >= 0) return static_cast<std::size_t>(o.prefetch);
  return cpus == 1 ? 0 : 2;
}

}  // namespace example
