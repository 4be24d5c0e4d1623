// The payload sizes of the C++ core, for Python without any framework (horovod_ext._sizes): the byte accounting of
// horovod_ext/compression reads them from here, so no size is ever derived twice. Only integers cross this binding.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "hvdext/ternary.h"
#include "hvdext/topk.h"
#include "hvdext/two_phase.h"

namespace {

PyObject* ternary_payload_bytes(PyObject*, PyObject* args) {
  long long n, packing;
  if (!PyArg_ParseTuple(args, "LL", &n, &packing)) return nullptr;
  if (n < 0 || (packing != 0 && packing != 1 && packing != 2)) {
    PyErr_Format(PyExc_ValueError, "ternary_payload_bytes: n must be >= 0 and packing 0 (2bit), 1 (base3) or 2 "
                 "(entropy: its largest size), got "
                 "n=%lld packing=%lld", n, packing);
    return nullptr;
  }
  return PyLong_FromLongLong(hvdext::ternary_payload_bytes(n, static_cast<hvdext::Packing>(packing)));
}

PyObject* ternary_packed_bytes(PyObject*, PyObject* args) {
  long long n, packing;
  if (!PyArg_ParseTuple(args, "LL", &n, &packing)) return nullptr;
  if (n < 0 || (packing != 0 && packing != 1)) {
    PyErr_Format(PyExc_ValueError, "ternary_packed_bytes: n must be >= 0 and packing 0 or 1, got n=%lld "
                 "packing=%lld", n, packing);
    return nullptr;
  }
  return PyLong_FromLongLong(hvdext::ternary_packed_bytes(n, static_cast<hvdext::Packing>(packing)));
}

PyObject* topk_payload_bytes(PyObject*, PyObject* args) {
  long long k, value_type;
  if (!PyArg_ParseTuple(args, "LL", &k, &value_type)) return nullptr;
  if (k < 0 || (value_type != 0 && value_type != 1)) {
    PyErr_Format(PyExc_ValueError, "topk_payload_bytes: k must be >= 0 and value_type 0 (fp16) or 1 (fp32), got "
                 "k=%lld value_type=%lld", k, value_type);
    return nullptr;
  }
  return PyLong_FromLongLong(hvdext::topk_payload_bytes(k, static_cast<hvdext::ValueType>(value_type)));
}

PyObject* two_phase_level_bits(PyObject*, PyObject* args) {
  long long nranks;
  if (!PyArg_ParseTuple(args, "L", &nranks)) return nullptr;
  if (nranks < 1) {
    PyErr_Format(PyExc_ValueError, "two_phase_level_bits: nranks must be >= 1, got %lld", nranks);
    return nullptr;
  }
  return PyLong_FromLong(hvdext::two_phase_level_bits(static_cast<int>(nranks)));
}

PyObject* two_phase_stream_bytes(PyObject*, PyObject* args) {
  long long count, bits;
  if (!PyArg_ParseTuple(args, "LL", &count, &bits)) return nullptr;
  return PyLong_FromLongLong(hvdext::two_phase_stream_bytes(count, static_cast<int>(bits)));
}

PyMethodDef methods[] = {
    {"ternary_payload_bytes", ternary_payload_bytes, METH_VARARGS, "bytes of one ternary payload of n elements"},
    {"ternary_packed_bytes", ternary_packed_bytes, METH_VARARGS, "bytes of n packed ternary codes"},
    {"topk_payload_bytes", topk_payload_bytes, METH_VARARGS, "bytes of one top-k payload of k elements"},
    {"two_phase_level_bits", two_phase_level_bits, METH_VARARGS, "bits per summed level of N ranks"},
    {"two_phase_stream_bytes", two_phase_stream_bytes, METH_VARARGS, "bytes of a level stream"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sizes", "payload sizes of horovod-ext's C++ core", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__sizes() { return PyModule_Create(&module); }
