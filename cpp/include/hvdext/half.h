// IEEE binary16 conversions shared by the CPU and GPU kernels: float_to_half rounds to nearest even and matches
// NumPy's astype(float16) bit for bit, NaN payloads included (CUDA's __float2half_rn does not keep them).
#pragma once
#include <cstdint>
#include <cstring>

#include "hvdext/common.h"

namespace hvdext {

HVDEXT_HD uint32_t bits_of(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  return x;
}

HVDEXT_HD float float_of(uint32_t x) {
  float f;
  std::memcpy(&f, &x, sizeof(f));
  return f;
}

HVDEXT_HD uint16_t float_to_half(float f) {
  const uint32_t x = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t mant = x & 0x7FFFFFu;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xFFu);
  if (exp == 0xFF) {
    if (mant == 0) return sign | 0x7C00u;
    uint16_t nan = static_cast<uint16_t>(0x7C00u + (mant >> 13));
    if (nan == 0x7C00u) ++nan;  // keep it a NaN
    return sign | nan;
  }
  const int32_t e = exp - 127 + 15;
  if (e >= 31) return sign | 0x7C00u;  // overflow: infinity
  if (e <= 0) {                         // a half subnormal, or zero
    if (e < -10) return sign;
    const uint32_t m = mant | 0x800000u;
    const int shift = 14 - e;
    uint32_t h = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1), half_way = 1u << (shift - 1);
    if (rest > half_way || (rest == half_way && (h & 1u))) ++h;
    return sign | static_cast<uint16_t>(h);
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right, up to infinity
  return sign | static_cast<uint16_t>(h);
}

HVDEXT_HD float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalize
      int e = -1;
      uint32_t m = mant;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400u) == 0);
      x = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((m & 0x3FFu) << 13);
    }
  } else if (exp == 0x1F) {
    x = sign | 0x7F800000u | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  return float_of(x);
}

}  // namespace hvdext
