// export_init: the example MLP's initial parameters (seed N) as raw little-endian float32, in
// PyTorch's named_parameters() order for Sequential(Linear, ReLU, Linear, ReLU, Linear):
// W1 [256, 784], b1, W2 [128, 256], b2, W3 [10, 128], b3. compare.py loads them into PyTorch.
//   export_init FILE [--seed N]
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "mlp_host.hpp"

int main(int argc, char** argv) {
  if (argc != 2 && !(argc == 4 && std::string_view(argv[2]) == "--seed")) {
    std::fprintf(stderr, "usage: export_init FILE [--seed N]\n");
    return 2;
  }
  const unsigned long long seed = argc == 4 ? std::strtoull(argv[3], nullptr, 10) : 0;
  const auto values = models::mlp_layout{}.initial_values(seed);
  std::FILE* f = std::fopen(argv[1], "wb");
  if (!f || std::fwrite(values.data(), sizeof(float), values.size(), f) != values.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "export_init: cannot write %s\n", argv[1]);
    return 1;
  }
  return 0;
}
