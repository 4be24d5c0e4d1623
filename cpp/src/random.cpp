// CPU kernel of the normal draw (include/hvdext/random.h).
#include "hvdext/random.h"

namespace hvdext {

void normal_fill(const RandomKey& key, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = normal_at(key, i);
}

}  // namespace hvdext
