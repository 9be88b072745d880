/* The double-precision reference the GEMM tests share: one dot product and
 * the sum of its terms' magnitudes (what a rounding bound scales with). */
#ifndef BL_TEST_REF_DOT_H
#define BL_TEST_REF_DOT_H
#include <math.h>
#include <stdint.h>

/* bias + sum_p a[p*as] b[p*bs] in double; *mag = |bias| + sum_p |a[p*as] b[p*bs]| */
static inline double ref_dot(const float *a, int64_t as, const float *b, int64_t bs, int64_t k, double bias,
                             double *mag) {
  double v = bias, m = fabs(bias);
  for (int64_t p = 0; p < k; p++) {
    double t = (double)a[p * as] * b[p * bs];
    v += t;
    m += fabs(t);
  }
  *mag = m;
  return v;
}
#endif
