/* The hot loops of a large dedup window's index (flux/shard/serial_index.py), in C.
 *
 * serial_index.py holds the tables (a 16-bit fingerprint array and a 32-bit serial
 * array each, in anonymous mappings) and the rules; this module only walks them, the
 * same way its numpy fallback does, one id after another instead of a numpy call per
 * step: a publish group's probe of every table costs a few microseconds, not a
 * hundred. Built with Flux when a C compiler is there; serial_index.py works without
 * it (slower), and the tests run both.
 *
 * A table's slots: fps[i] == 0 is empty; an id's home slot is the low 32 bits of its
 * hash scaled to `homes`; a probe runs forward from there and stops at an empty slot
 * (the table keeps its last slot empty, so every probe ends inside it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define DEAD 0xFFFFFFFFu
#define AHEAD 8  /* ids ahead whose home slots a walk asks the memory for */

static inline uint16_t fingerprint(uint64_t h) {
    uint16_t fp = (uint16_t)(h >> 48);
    return fp ? fp : 1;
}

static inline uint64_t home(uint64_t h, uint64_t homes) {
    return ((h & 0xFFFFFFFFull) * homes) >> 32;
}

/* hashes(ids) -> bytes: hash() of each id (a str caches its own), 8 bytes each. */
static PyObject *hashes(PyObject *self, PyObject *ids) {
    PyObject *seq = PySequence_Fast(ids, "ids must be iterable");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    uint64_t *h = (uint64_t *)PyBytes_AS_STRING(out);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_hash_t x = PyObject_Hash(items[i]);
        if (x == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            Py_DECREF(out);
            return NULL;
        }
        h[i] = (uint64_t)x;
    }
    Py_DECREF(seq);
    return out;
}

/* One table's fingerprint slots, as a buffer, with its number of home slots. */
typedef struct {
    Py_buffer fps;
    uint64_t homes;
} Slots;

static int slots_of(PyObject *table, Slots *s) {
    PyObject *area;
    unsigned long long homes;
    if (!PyArg_ParseTuple(table, "OK", &area, &homes))
        return -1;
    if (PyObject_GetBuffer(area, &s->fps, PyBUF_SIMPLE) < 0)
        return -1;
    s->homes = homes;
    return 0;
}

/* maybe(tables, hashes, out): out[i] = 1 where some table holds hash i's fingerprint
 * before the first empty slot of its probe (else out[i] is left as it is).
 * tables: a sequence of (fingerprint area, homes). */
static PyObject *maybe(PyObject *self, PyObject *args) {
    PyObject *tables;
    Py_buffer hb, ob;
    if (!PyArg_ParseTuple(args, "Oy*w*", &tables, &hb, &ob))
        return NULL;
    PyObject *seq = PySequence_Fast(tables, "tables must be a sequence");
    Py_ssize_t n = hb.len / 8;
    if (seq == NULL || ob.len < n) {
        if (seq != NULL)
            PyErr_SetString(PyExc_ValueError, "out is shorter than hashes");
        Py_XDECREF(seq);
        PyBuffer_Release(&hb);
        PyBuffer_Release(&ob);
        return NULL;
    }
    const uint64_t *h = hb.buf;
    uint8_t *out = ob.buf;
    for (Py_ssize_t t = 0; t < PySequence_Fast_GET_SIZE(seq); t++) {
        Slots s;
        if (slots_of(PySequence_Fast_GET_ITEM(seq, t), &s) < 0) {
            Py_DECREF(seq);
            PyBuffer_Release(&hb);
            PyBuffer_Release(&ob);
            return NULL;
        }
        const uint16_t *fps = s.fps.buf;
        uint64_t size = (uint64_t)s.fps.len / 2;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i + AHEAD < n)  /* a large table's slots are a cache miss each: ask early */
                __builtin_prefetch(&fps[home(h[i + AHEAD], s.homes)]);
            if (out[i])
                continue;
            uint16_t fp = fingerprint(h[i]);
            for (uint64_t j = home(h[i], s.homes); j < size && fps[j]; j++) {
                if (fps[j] == fp) {
                    out[i] = 1;
                    break;
                }
            }
        }
        PyBuffer_Release(&s.fps);
    }
    Py_DECREF(seq);
    PyBuffer_Release(&hb);
    PyBuffer_Release(&ob);
    Py_RETURN_NONE;
}

/* place(fps, rels, homes, last_slot, first, hashes, serials) -> how many were placed:
 * each serial (int64, in order) at the first empty slot from its hash's home, its
 * fingerprint in fps and its serial less `first` in rels. Stops at the first whose
 * probe reaches `last_slot` (the table then takes no more). */
static PyObject *place(PyObject *self, PyObject *args) {
    Py_buffer fb, rb, hb, sb;
    unsigned long long homes, first;
    Py_ssize_t last_slot;
    if (!PyArg_ParseTuple(args, "w*w*KnKy*y*", &fb, &rb, &homes, &last_slot, &first, &hb,
                          &sb))
        return NULL;
    Py_ssize_t n = hb.len / 8, placed = 0;
    uint16_t *fps = fb.buf;
    uint32_t *rels = rb.buf;
    const uint64_t *h = hb.buf;
    const int64_t *serials = sb.buf;
    if (sb.len / 8 < n || last_slot < 0 || (uint64_t)last_slot >= (uint64_t)fb.len / 2
            || (uint64_t)last_slot >= (uint64_t)rb.len / 4) {
        PyErr_SetString(PyExc_ValueError, "place: buffers do not fit the table");
    } else {
        for (; placed < n; placed++) {
            if (placed + AHEAD < n) {
                uint64_t ahead = home(h[placed + AHEAD], homes);
                __builtin_prefetch(&fps[ahead], 1);
                __builtin_prefetch(&rels[ahead], 1);
            }
            uint64_t j = home(h[placed], homes);
            while (j < (uint64_t)last_slot && fps[j])
                j++;
            if (j >= (uint64_t)last_slot)
                break;
            fps[j] = fingerprint(h[placed]);
            rels[j] = (uint32_t)((uint64_t)serials[placed] - first);
        }
    }
    PyBuffer_Release(&fb);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&hb);
    PyBuffer_Release(&sb);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromSsize_t(placed);
}

/* find(tables, h, oldest) -> [serial, ...]: the live serials (not taken out, not below
 * `oldest`) whose slots hold h's fingerprint on its probe, newest table first.
 * tables: a sequence of (fingerprint area, serial area, homes, first), oldest first. */
static PyObject *find(PyObject *self, PyObject *args) {
    PyObject *tables;
    unsigned long long h, oldest;
    if (!PyArg_ParseTuple(args, "OKK", &tables, &h, &oldest))
        return NULL;
    PyObject *seq = PySequence_Fast(tables, "tables must be a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *found = PyList_New(0);
    uint16_t fp = fingerprint(h);
    for (Py_ssize_t t = PySequence_Fast_GET_SIZE(seq) - 1; found != NULL && t >= 0; t--) {
        PyObject *fa, *ra;
        unsigned long long homes, first;
        Py_buffer fb, rb;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, t), "OOKK", &fa, &ra, &homes,
                              &first)
                || PyObject_GetBuffer(fa, &fb, PyBUF_SIMPLE) < 0) {
            Py_CLEAR(found);
            break;
        }
        if (PyObject_GetBuffer(ra, &rb, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&fb);
            Py_CLEAR(found);
            break;
        }
        const uint16_t *fps = fb.buf;
        const uint32_t *rels = rb.buf;
        uint64_t size = (uint64_t)fb.len / 2;
        if ((uint64_t)rb.len / 4 < size)
            size = (uint64_t)rb.len / 4;
        for (uint64_t j = home(h, homes); j < size && fps[j]; j++) {
            if (fps[j] != fp || rels[j] == DEAD || first + rels[j] < oldest)
                continue;
            PyObject *serial = PyLong_FromUnsignedLongLong(first + rels[j]);
            if (serial == NULL || PyList_Append(found, serial) < 0) {
                Py_XDECREF(serial);
                Py_CLEAR(found);
                break;
            }
            Py_DECREF(serial);
        }
        PyBuffer_Release(&fb);
        PyBuffer_Release(&rb);
    }
    Py_DECREF(seq);
    return found;
}

static PyMethodDef methods[] = {
    {"hashes", hashes, METH_O, "hash() of each id, as 8-byte unsigned integers."},
    {"maybe", maybe, METH_VARARGS, "Mark the hashes some table may hold."},
    {"place", place, METH_VARARGS, "Place serials in one table; returns how many."},
    {"find", find, METH_VARARGS, "The live serials a hash's probes meet, newest first."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_serial_probe",
    "The hot loops of a large dedup window's index (see flux.shard.serial_index).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__serial_probe(void) { return PyModule_Create(&module); }
