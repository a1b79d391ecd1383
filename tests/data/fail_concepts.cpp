// Compile-failure checks (run by ctest, which expects the compiler's error text): a type that
// is not a dataset, and a range views::batched cannot cut, each get partrain's sentence.
#include <list>
#include <partrain/data/loader.hpp>
#include <partrain/data/sequential.hpp>

#if PARTRAIN_FAIL_CASE == 1
struct not_a_dataset {  // has size() but no example_shape() or fetch()
  std::size_t size() const { return 3; }
};
void f() {
  const not_a_dataset ds;
  partrain::loader l(ds, partrain::views::sequential(3));
}
#elif PARTRAIN_FAIL_CASE == 2
void f() {
  std::list<std::size_t> indices{1, 2, 3};  // not random access
  auto b = indices | partrain::views::batched(2);
}
#endif
