/* A shared subscription member's bookkeeping of what it holds (flux/shard/held_keys.py),
 * in C: one pass over a batch instead of several.
 *
 * held_keys.py keeps the rules and a Python version of each function that does the
 * same; the shard calls whichever it has, and the tests run both against each other.
 * The maps are a member's: `in_flight` (offset -> pushes), `key_of` (held keyed
 * offset -> key) and `keys` (pinned key -> how many of its offsets it holds).
 * Built with Flux when a C compiler is there.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* hold_keys(key_of, keys, offsets, key_at): each of `offsets` that `key_at` gives a
 * key and `key_of` does not hold yet is held under that key, and its key counted. */
static PyObject *hold_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "hold_keys takes key_of, keys, offsets, key_at");
        return NULL;
    }
    PyObject *key_of = args[0], *keys = args[1], *key_at = args[3];
    if (!PyDict_CheckExact(key_of) || !PyDict_CheckExact(keys) || !PyDict_CheckExact(key_at)) {
        PyErr_SetString(PyExc_TypeError, "key_of, keys and key_at must be dicts");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[2], "offsets must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *offset = items[i];
        PyObject *key = PyDict_GetItemWithError(key_at, offset);  /* borrowed */
        if (key == NULL) {
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        if (key == Py_None)
            continue;
        int has = PyDict_Contains(key_of, offset);
        if (has < 0)
            goto fail;
        if (has)
            continue;
        Py_INCREF(key);  /* (key_at's entry may go while we use it: hold our own) */
        if (PyDict_SetItem(key_of, offset, key) < 0) {
            Py_DECREF(key);
            goto fail;
        }
        Py_ssize_t count = 0;
        PyObject *old = PyDict_GetItemWithError(keys, key);  /* borrowed */
        if (old != NULL) {
            count = PyLong_AsSsize_t(old);
            if (count == -1 && PyErr_Occurred()) {
                Py_DECREF(key);
                goto fail;
            }
        } else if (PyErr_Occurred()) {
            Py_DECREF(key);
            goto fail;
        }
        PyObject *now = PyLong_FromSsize_t(count + 1);
        if (now == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        int err = PyDict_SetItem(keys, key, now);
        Py_DECREF(now);
        Py_DECREF(key);
        if (err < 0)
            goto fail;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

/* Whether `offsets` (n items) are distinct: 1 yes, 0 no, -1 an error. Rising ones are
 * (the usual ack); otherwise a set of them says. */
static int distinct(PyObject *const *items, Py_ssize_t n) {
    Py_ssize_t i;
    for (i = 1; i < n; i++) {
        int lt = PyObject_RichCompareBool(items[i - 1], items[i], Py_LT);
        if (lt < 0)
            return -1;
        if (!lt)
            break;
    }
    if (i >= n)
        return 1;
    PyObject *set = PySet_New(NULL);
    if (set == NULL)
        return -1;
    for (i = 0; i < n; i++) {
        if (PySet_Add(set, items[i]) < 0) {
            Py_DECREF(set);
            return -1;
        }
    }
    Py_ssize_t size = PySet_GET_SIZE(set);
    Py_DECREF(set);
    return size == n;
}

/* let_go(in_flight, key_of, keys, offsets) -> list | None: None (nothing changed) unless
 * `offsets` are distinct ints all in `in_flight`; else each leaves `in_flight` and
 * `key_of`, its key counted one less, and the keys left with none held (taken out of
 * `keys`) are returned in the order they emptied. */
static PyObject *let_go(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "let_go takes in_flight, key_of, keys, offsets");
        return NULL;
    }
    PyObject *in_flight = args[0], *key_of = args[1], *keys = args[2];
    if (!PyDict_CheckExact(in_flight) || !PyDict_CheckExact(key_of) || !PyDict_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "in_flight, key_of and keys must be dicts");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[3], "offsets must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *released = NULL;
    if (n == 0)
        goto refuse;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyLong_CheckExact(items[i]))
            goto refuse;
        int has = PyDict_Contains(in_flight, items[i]);
        if (has < 0)
            goto fail;
        if (!has)
            goto refuse;
    }
    int ok = distinct(items, n);
    if (ok < 0)
        goto fail;
    if (!ok)
        goto refuse;
    released = PyList_New(0);
    if (released == NULL)
        goto fail;
    int keyed = PyDict_GET_SIZE(key_of) > 0;
    /* out of the window first, then keys: the Python's order (even on an error) */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyDict_DelItem(in_flight, items[i]) < 0)
            goto fail;
    }
    for (Py_ssize_t i = 0; keyed && i < n; i++) {
        PyObject *offset = items[i];
        PyObject *key = PyDict_GetItemWithError(key_of, offset);  /* borrowed */
        if (key == NULL) {
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        Py_INCREF(key);  /* (its entry in key_of goes next) */
        if (PyDict_DelItem(key_of, offset) < 0) {
            Py_DECREF(key);
            goto fail;
        }
        if (key == Py_None) {
            Py_DECREF(key);
            continue;
        }
        PyObject *old = PyDict_GetItemWithError(keys, key);  /* borrowed */
        if (old == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, key);
            Py_DECREF(key);
            goto fail;
        }
        Py_ssize_t left = PyLong_AsSsize_t(old);
        if (left == -1 && PyErr_Occurred()) {
            Py_DECREF(key);
            goto fail;
        }
        left -= 1;
        int err;
        if (left) {
            PyObject *now = PyLong_FromSsize_t(left);
            if (now == NULL) {
                Py_DECREF(key);
                goto fail;
            }
            err = PyDict_SetItem(keys, key, now);
            Py_DECREF(now);
        } else {
            err = PyDict_DelItem(keys, key);
            if (err == 0)
                err = PyList_Append(released, key);
        }
        Py_DECREF(key);
        if (err < 0)
            goto fail;
    }
    Py_DECREF(seq);
    return released;
refuse:
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(released);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef methods[] = {
    {"hold_keys", (PyCFunction)(void (*)(void))hold_keys, METH_FASTCALL,
     "hold_keys(key_of, keys, offsets, key_at): hold each offset's key, counted."},
    {"let_go", (PyCFunction)(void (*)(void))let_go, METH_FASTCALL,
     "let_go(in_flight, key_of, keys, offsets) -> keys emptied, or None if refused."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_held_keys",
    .m_doc = "A shared subscription member's held offsets and keys, a batch at a time.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__held_keys(void) { return PyModule_Create(&module); }
