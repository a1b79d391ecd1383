// Must not compile: sgd given a list of layers, which is not a model until sequential wraps it.
#include <partrain/optim/sgd.hpp>

#include "common.hpp"

int main() {
  std::vector<cf::scale_layer> layers(2);
  partrain::sgd opt(layers, {.lr = 0.1});
  (void)opt;
}
