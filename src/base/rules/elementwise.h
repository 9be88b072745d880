/* Elementwise rules of src/tensor/elementwise.c and kernels/elementwise.cu: the value of a binary and a unary
 * operation (computed in double on both devices' generic paths) and their names in error messages. */
#ifndef BL_RULES_ELEMENTWISE_H
#define BL_RULES_ELEMENTWISE_H
#include <math.h>
#include "bl_tensor.h"
#include "hd.h"

static const char *const bl_binop_names[BL_NUM_BINOPS] = { "add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                                           "eq",  "ne",  "lt",  "le",  "gt",  "ge" };
static const char *const bl_unop_names[BL_NUM_UNOPS] = { "neg",        "abs",  "exp",     "log",  "sqrt",
                                                         "rsqrt",      "tanh", "sigmoid", "relu", "square",
                                                         "reciprocal", "sign", "floor",   "ceil", "erf" };

/* maximum/minimum propagate a NaN in either operand (the first one's when both are NaN), as torch does */
BL_HD double bl_binop_eval(int op, double x, double y) {
  switch (op) {
    case BL_ADD: return x + y;
    case BL_SUB: return x - y;
    case BL_MUL: return x * y;
    case BL_DIV: return x / y;
    case BL_POW: return pow(x, y);
    case BL_MAXIMUM: return (x != x || x > y) ? x : y;
    case BL_MINIMUM: return (x != x || x < y) ? x : y;
    case BL_EQ: return x == y;
    case BL_NE: return x != y;
    case BL_LT: return x < y;
    case BL_LE: return x <= y;
    case BL_GT: return x > y;
    default: return x >= y; /* BL_GE (op is checked before any element is computed) */
  }
}

BL_HD double bl_unop_eval(int op, double x) {
  switch (op) {
    case BL_NEG: return -x;
    case BL_ABS: return fabs(x);
    case BL_EXP: return exp(x);
    case BL_LOG: return log(x);
    case BL_SQRT: return sqrt(x);
    case BL_RSQRT: return 1.0 / sqrt(x);
    case BL_TANH: return tanh(x);
    case BL_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case BL_RELU: return x > 0 ? x : 0;
    case BL_SQUARE: return x * x;
    case BL_RECIPROCAL: return 1.0 / x;
    case BL_SIGN: return (double)((x > 0) - (x < 0));
    case BL_FLOOR: return floor(x);
    case BL_CEIL: return ceil(x);
    default: return erf(x); /* BL_ERF */
  }
}
#endif
