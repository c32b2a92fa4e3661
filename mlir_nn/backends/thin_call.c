/* The thin call of a compiled CPU step: argument checks, descriptor binding, the native
 * call and fresh output arrays in one C function (built and loaded by thin_call.py).
 *
 * A ThinCall holds what the Python side set up once: where the descriptor words of the
 * step's arguments live, what each input must look like, a snapshot of the parameter
 * arrays Python validated and bound last, and the workspace of the current batch size.
 * run(inputs, params) checks plainly valid arguments against all that and calls the step;
 * anything else returns None, and the caller takes the fully checked path in Python,
 * which binds and snapshots again. Every call writes its outputs into fresh arrays it
 * allocates before the native call (only their data pointers are bound per call) and
 * returns them: nothing is copied out. A non-zero status word after the call (the compiled
 * step found NaN or infinity in an input and wrote nothing) becomes the exception that
 * error(index, inputs) builds. One lock per ThinCall serializes calls; the GIL is
 * released only around the native call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdint.h>
#include <string.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#define MAX_RANK 16

typedef void (*packed_fn)(void **);
/* the task runtime's mlirnn_runtime_run_step: runs a step on the team width it measures best,
 * its measurements kept in the bound workspace's header */
typedef void (*step_runner)(packed_fn, void **, void *);
#define HEADER 64 /* workspace.py */

typedef struct {
    PyArray_Descr *descr; /* the dtype it must have */
    int ndim;
    int batch_major;        /* dim 0 is the batch size, the others fixed */
    npy_intp dims[MAX_RANK]; /* fixed sizes (dims[0] unused when batch_major) */
    Py_ssize_t word;        /* its descriptor's first word */
} InputSpec;

typedef struct {
    PyArrayObject *array; /* bound last (a strong reference), or NULL */
    void *data;
    PyArray_Descr *descr; /* a strong reference: a freed dtype's address can come back as another one */
    int ndim;
    npy_intp dims[MAX_RANK];
    npy_intp strides[MAX_RANK];
    npy_intp nbytes;
} Snapshot;

typedef struct {
    PyArray_Descr *descr; /* a strong reference */
    int ndim;
    npy_intp dims[MAX_RANK]; /* at the bound batch size */
    Py_ssize_t word;         /* its descriptor's first word */
} OutputSpec;

typedef struct {
    Py_ssize_t param; /* the 0-d parameter it writes */
    PyObject *source; /* returns its current value */
} Feed;

typedef struct {
    PyObject_HEAD
    packed_fn fn;
    step_runner runner;  /* runs fn on the team width it measures, or NULL: fn is called directly */
    Py_ssize_t choice_offset; /* where in the workspace the runner keeps its measurements */
    void **packed;       /* the step's void **args */
    int64_t *words;      /* the descriptors' words */
    PyObject *keep;      /* owner of packed and words */
    PyObject *error;     /* error(index, inputs) -> exception for a bad status */
    Py_ssize_t n_inputs, n_params, n_feeds;
    InputSpec *inputs;
    Snapshot *params;
    PyObject *tensors;   /* watched tensors (run_captured), or NULL */
    PyObject *data_name; /* their attribute holding the array */
    Feed *feeds;
    int plain;           /* 0: run() always answers None */
    Py_ssize_t batch;    /* batch size of the bound workspace; -1: none */
    int32_t *status;
    PyObject *workspace; /* its buffer (owner of status) */
    OutputSpec *outputs; /* the outputs at the bound batch size, or NULL */
    Py_ssize_t n_outputs;
    PyThread_type_lock lock;
} ThinCall;

static void lock(ThinCall *self) {
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

static void unlock(ThinCall *self) { PyThread_release_lock(self->lock); }

static void forget_params(ThinCall *self) {
    for (Py_ssize_t i = 0; i < self->n_params; i++) {
        Py_CLEAR(self->params[i].array);
        Py_CLEAR(self->params[i].descr);
    }
}

static void forget_watch(ThinCall *self) {
    for (Py_ssize_t i = 0; i < self->n_feeds; i++) {
        Py_CLEAR(self->feeds[i].source);
    }
    PyMem_Free(self->feeds);
    self->feeds = NULL;
    self->n_feeds = 0;
    Py_CLEAR(self->tensors);
    Py_CLEAR(self->data_name);
}

static void forget_workspace(ThinCall *self) {
    self->batch = -1;
    self->status = NULL;
    Py_CLEAR(self->workspace);
    for (Py_ssize_t k = 0; self->outputs && k < self->n_outputs; k++) {
        Py_CLEAR(self->outputs[k].descr);
    }
    PyMem_Free(self->outputs);
    self->outputs = NULL;
    self->n_outputs = 0;
}

/* The garbage collector's view: error is usually a bound method of the executable that holds
 * this object, a cycle only the collector can free. */
static int ThinCall_traverse(ThinCall *self, visitproc visit, void *arg) {
    Py_VISIT(self->keep);
    Py_VISIT(self->error);
    Py_VISIT(self->tensors);
    Py_VISIT(self->data_name);
    for (Py_ssize_t i = 0; i < self->n_feeds; i++) {
        Py_VISIT(self->feeds[i].source);
    }
    for (Py_ssize_t i = 0; self->params && i < self->n_params; i++) {
        Py_VISIT(self->params[i].array);
    }
    Py_VISIT(self->workspace);
    return 0;
}

/* Break cycles: with no workspace bound, run() answers None and nothing calls error. */
static int ThinCall_clear(ThinCall *self) {
    if (self->params) {
        forget_params(self);
    }
    forget_watch(self);
    forget_workspace(self);
    Py_CLEAR(self->error);
    return 0;
}

static void ThinCall_dealloc(ThinCall *self) {
    PyObject_GC_UnTrack(self);
    if (self->params) {
        forget_params(self);
    }
    forget_watch(self);
    forget_workspace(self);
    PyMem_Free(self->params);
    Py_XDECREF(self->keep);
    Py_XDECREF(self->error);
    for (Py_ssize_t i = 0; self->inputs && i < self->n_inputs; i++) {
        Py_XDECREF(self->inputs[i].descr);
    }
    PyMem_Free(self->inputs);
    if (self->lock) {
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int parse_dims(PyObject *dims, npy_intp *out, int ndim) {
    PyObject *seq = PySequence_Fast(dims, "dims must be a sequence");
    if (!seq) {
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(seq) != ndim) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "dims must have ndim entries");
        return -1;
    }
    for (int d = 0; d < ndim; d++) {
        out[d] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, d));
        if (out[d] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* ThinCall(function, packed, words, keep, inputs, n_params, error[, runner, choice_offset]): inputs
 * is a sequence of (dtype, dims, batch_major, word), dims all sizes (dims[0] ignored when
 * batch_major), or None for a step whose calls always take the checked path; runner, when given
 * (not 0), is the task runtime's mlirnn_runtime_run_step, which then makes every call and keeps
 * its measurements at choice_offset in the bound workspace. */
static int ThinCall_init(ThinCall *self, PyObject *args, PyObject *kwds) {
    unsigned long long function, packed, words, runner = 0;
    Py_ssize_t choice_offset = 0;
    PyObject *keep, *specs, *error;
    Py_ssize_t n_params;
    if (!PyArg_ParseTuple(args, "KKKOOnO|Kn", &function, &packed, &words, &keep, &specs, &n_params, &error, &runner,
                          &choice_offset)) {
        return -1;
    }
    if (self->lock) {
        PyErr_SetString(PyExc_RuntimeError, "ThinCall is initialized once");
        return -1;
    }
    if (n_params < 0) {
        PyErr_SetString(PyExc_ValueError, "ThinCall: n_params must not be negative");
        return -1;
    }
    self->fn = (packed_fn)(uintptr_t)function;
    if (runner && (choice_offset < 4 || choice_offset >= HEADER)) {
        PyErr_SetString(PyExc_ValueError, "ThinCall: the team choice must lie in the workspace header after the status word");
        return -1;
    }
    self->runner = (step_runner)(uintptr_t)runner;
    self->choice_offset = choice_offset;
    self->packed = (void **)(uintptr_t)packed;
    self->words = (int64_t *)(uintptr_t)words;
    Py_INCREF(keep);
    self->keep = keep;
    Py_INCREF(error);
    self->error = error;
    self->batch = -1;
    self->lock = PyThread_allocate_lock();
    if (!self->lock) {
        PyErr_NoMemory();
        return -1;
    }
    self->plain = specs != Py_None;
    PyObject *seq = self->plain ? PySequence_Fast(specs, "inputs must be a sequence or None") : PyTuple_New(0);
    if (!seq) {
        return -1;
    }
    self->n_inputs = PySequence_Fast_GET_SIZE(seq);
    self->inputs = PyMem_Calloc(self->n_inputs + 1, sizeof(InputSpec));
    self->n_params = n_params;
    self->params = PyMem_Calloc(n_params + 1, sizeof(Snapshot));
    if (!self->inputs || !self->params) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < self->n_inputs; i++) {
        InputSpec *spec = &self->inputs[i];
        PyObject *dtype, *dims;
        int batch_major;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "OOpn", &dtype, &dims, &batch_major, &spec->word)) {
            Py_DECREF(seq);
            return -1;
        }
        if (!PyArray_DescrCheck(dtype)) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "an input's dtype must be a numpy dtype");
            return -1;
        }
        spec->ndim = (int)PySequence_Size(dims);
        if (spec->ndim < 0 || spec->ndim > MAX_RANK || parse_dims(dims, spec->dims, spec->ndim) < 0) {
            Py_DECREF(seq);
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "input rank out of range");
            }
            return -1;
        }
        spec->batch_major = batch_major;
        Py_INCREF(dtype);
        spec->descr = (PyArray_Descr *)dtype;
    }
    Py_DECREF(seq);
    return 0;
}

/* A borrowed or new reference to parameter i; *owned says which. NULL: not an ndarray. */
static PyArrayObject *param_array(ThinCall *self, PyObject *const *params, Py_ssize_t i, int *owned) {
    if (params) {
        *owned = 0;
        return PyArray_CheckExact(params[i]) ? (PyArrayObject *)params[i] : NULL;
    }
    PyObject *value = PyObject_GetAttr(PyTuple_GET_ITEM(self->tensors, i), self->data_name);
    if (!value) {
        PyErr_Clear();
        return NULL;
    }
    *owned = 1;
    if (!PyArray_CheckExact(value)) {
        Py_DECREF(value);
        return NULL;
    }
    return (PyArrayObject *)value;
}

static int same_as_bound(const Snapshot *s, PyArrayObject *a) {
    int needed = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_WRITEABLE;
    return s->array == a && PyArray_DATA(a) == s->data && PyArray_DESCR(a) == s->descr &&
           PyArray_NDIM(a) == s->ndim && (PyArray_FLAGS(a) & needed) == needed &&
           memcmp(PyArray_DIMS(a), s->dims, s->ndim * sizeof(npy_intp)) == 0 &&
           memcmp(PyArray_STRIDES(a), s->strides, s->ndim * sizeof(npy_intp)) == 0;
}

/* The batch size when every input is plainly valid, else -1. */
static Py_ssize_t check_inputs(ThinCall *self, PyObject *const *inputs) {
    Py_ssize_t batch = -1;
    for (Py_ssize_t i = 0; i < self->n_inputs; i++) {
        const InputSpec *spec = &self->inputs[i];
        PyObject *x = inputs[i];
        if (!PyArray_CheckExact(x)) {
            return -1;
        }
        PyArrayObject *a = (PyArrayObject *)x;
        PyArray_Descr *descr = PyArray_DESCR(a);
        if (PyArray_NDIM(a) != spec->ndim || (descr != spec->descr && !PyArray_EquivTypes(descr, spec->descr))) {
            return -1;
        }
        /* a view may alias a parameter: the checked path copies it */
        if (!PyArray_IS_C_CONTIGUOUS(a) || PyArray_BASE(a) != NULL) {
            return -1;
        }
        const npy_intp *dims = PyArray_DIMS(a);
        for (int d = spec->batch_major; d < spec->ndim; d++) {
            if (dims[d] != spec->dims[d]) {
                return -1;
            }
        }
        if (spec->batch_major) {
            if (batch == -1) {
                batch = dims[0];
            } else if (dims[0] != batch) {
                return -1;
            }
        }
    }
    if (batch == -1) {
        return 1; /* no input has a batch dim */
    }
    return batch > 0 ? batch : -1;
}

/* True when the bound parameters are unchanged and no input overlaps one of them. */
static int check_params(ThinCall *self, PyObject *const *params, PyObject *const *inputs) {
    for (Py_ssize_t i = 0; i < self->n_params; i++) {
        int owned;
        PyArrayObject *a = param_array(self, params, i, &owned);
        int same = a != NULL && same_as_bound(&self->params[i], a);
        if (owned) {
            Py_DECREF(a);
        }
        if (!same) {
            return 0;
        }
    }
    for (Py_ssize_t i = 0; i < self->n_inputs; i++) {
        PyArrayObject *x = (PyArrayObject *)inputs[i];
        char *start = PyArray_DATA(x), *end = start + PyArray_NBYTES(x);
        for (Py_ssize_t k = 0; k < self->n_params; k++) {
            char *p = self->params[k].data;
            if (start < p + self->params[k].nbytes && p < end) {
                return 0;
            }
        }
    }
    return 1;
}

/* Write every hyperparameter feed from its Python source: 0, or -1 with the source's error set
 * (never cleared: a KeyboardInterrupt that lands in a source is the caller's to see). */
static int refresh_feeds(ThinCall *self) {
    for (Py_ssize_t i = 0; i < self->n_feeds; i++) {
        PyObject *value = PyObject_CallNoArgs(self->feeds[i].source);
        if (!value) {
            return -1;
        }
        double number = PyFloat_AsDouble(value);
        Py_DECREF(value);
        if (number == -1.0 && PyErr_Occurred()) {
            return -1;
        }
        Snapshot *s = &self->params[self->feeds[i].param];
        if (s->descr->type_num == NPY_FLOAT) {
            *(float *)s->data = (float)number;
        } else {
            *(double *)s->data = number;
        }
    }
    return 0;
}

static void call_native(ThinCall *self) {
    Py_BEGIN_ALLOW_THREADS
    if (self->runner && self->status) {
        self->runner(self->fn, self->packed, (char *)self->status + self->choice_offset);
    } else {
        self->fn(self->packed);
    }
    Py_END_ALLOW_THREADS
}

/* Fresh arrays for one call's outputs, their data pointers bound; NULL (MemoryError) if one
 * cannot be allocated, before anything runs. */
static PyObject *fresh_outputs(ThinCall *self) {
    PyObject *list = PyList_New(self->n_outputs);
    for (Py_ssize_t k = 0; list && k < self->n_outputs; k++) {
        OutputSpec *o = &self->outputs[k];
        Py_INCREF(o->descr); /* PyArray_Empty steals it */
        PyObject *out = PyArray_Empty(o->ndim, o->dims, o->descr, 0);
        if (!out) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, k, out);
        int64_t *w = self->words + o->word;
        w[0] = w[1] = (int64_t)(intptr_t)PyArray_DATA((PyArrayObject *)out);
    }
    return list;
}

/* The outputs, or the exception for a bad status. */
static PyObject *results(ThinCall *self, PyObject *inputs, PyObject *outputs) {
    int32_t status = *self->status;
    if (status) {
        Py_DECREF(outputs);
        PyObject *exc = PyObject_CallFunction(self->error, "iO", status - 1, inputs);
        if (exc) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        return NULL;
    }
    return outputs;
}

/* The plain call: None when the arguments need the checked path. */
static PyObject *plain_call(ThinCall *self, PyObject *inputs, PyObject *params_seq) {
    PyObject *in = PySequence_Tuple(inputs); /* holds the inputs while the GIL is released */
    if (!in) {
        return NULL;
    }
    PyObject *ps = NULL;
    if (params_seq && !(ps = PySequence_Fast(params_seq, "params must be a sequence"))) {
        Py_DECREF(in);
        return NULL;
    }
    PyObject *result = Py_None;
    lock(self);
    if (!self->plain || self->outputs == NULL || PyTuple_GET_SIZE(in) != self->n_inputs ||
        (ps && PySequence_Fast_GET_SIZE(ps) != self->n_params) || (!ps && !self->tensors)) {
        goto done;
    }
    PyObject *const *xs = ((PyTupleObject *)in)->ob_item;
    Py_ssize_t batch = check_inputs(self, xs);
    if (batch != self->batch || !check_params(self, ps ? PySequence_Fast_ITEMS(ps) : NULL, xs)) {
        goto done;
    }
    if (refresh_feeds(self) < 0) {
        result = NULL;
        goto failed;
    }
    for (Py_ssize_t i = 0; i < self->n_inputs; i++) {
        int64_t *w = self->words + self->inputs[i].word;
        w[0] = w[1] = (int64_t)(intptr_t)PyArray_DATA((PyArrayObject *)xs[i]);
        if (self->inputs[i].batch_major) {
            w[3] = batch;
        }
    }
    PyObject *outputs = fresh_outputs(self);
    if (outputs) {
        call_native(self);
        result = results(self, in, outputs);
    } else {
        result = NULL;
    }
failed:
    unlock(self);
    Py_DECREF(in);
    Py_XDECREF(ps);
    return result;
done:
    unlock(self);
    Py_DECREF(in);
    Py_XDECREF(ps);
    Py_RETURN_NONE;
}

static PyObject *ThinCall_run(ThinCall *self, PyObject *args) {
    PyObject *inputs, *params;
    if (!PyArg_ParseTuple(args, "OO", &inputs, &params)) {
        return NULL;
    }
    return plain_call(self, inputs, params);
}

static PyObject *ThinCall_run_captured(ThinCall *self, PyObject *inputs) { return plain_call(self, inputs, NULL); }

/* watch(tensors, data_name, feeds): run_captured reads parameter i from tensors[i].<data_name>
 * and first writes source() into parameter j for every (j, source) in feeds. */
static PyObject *ThinCall_watch(ThinCall *self, PyObject *args) {
    PyObject *tensors, *name, *feeds;
    if (!PyArg_ParseTuple(args, "O!UO", &PyTuple_Type, &tensors, &name, &feeds)) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(tensors) != self->n_params) {
        PyErr_SetString(PyExc_ValueError, "watch: one tensor per parameter");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(feeds, "feeds must be a sequence");
    if (!seq) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Feed *table = PyMem_Calloc(n + 1, sizeof(Feed));
    if (!table) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *source;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "nO", &table[i].param, &source) ||
            table[i].param < 0 || table[i].param >= self->n_params) {
            for (Py_ssize_t k = 0; k < i; k++) {
                Py_DECREF(table[k].source);
            }
            PyMem_Free(table);
            Py_DECREF(seq);
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "watch: a feed's parameter index is out of range");
            }
            return NULL;
        }
        Py_INCREF(source);
        table[i].source = source;
    }
    Py_DECREF(seq);
    lock(self);
    forget_watch(self);
    forget_params(self); /* feeds are written through the snapshot: bind again */
    Py_INCREF(tensors);
    self->tensors = tensors;
    Py_INCREF(name);
    self->data_name = name;
    self->feeds = table;
    self->n_feeds = n;
    unlock(self);
    Py_RETURN_NONE;
}

/* bind_params(arrays): snapshot the parameter arrays the caller validated and bound (lock held). */
static PyObject *ThinCall_bind_params(ThinCall *self, PyObject *arrays) {
    PyObject *seq = PySequence_Fast(arrays, "params must be a sequence");
    if (!seq) {
        return NULL;
    }
    if (PySequence_Fast_GET_SIZE(seq) != self->n_params) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "bind_params: one array per parameter");
        return NULL;
    }
    forget_params(self);
    for (Py_ssize_t i = 0; i < self->n_params; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyArray_CheckExact(item) || PyArray_NDIM((PyArrayObject *)item) > MAX_RANK) {
            continue; /* never plain: that parameter always takes the checked path */
        }
        PyArrayObject *a = (PyArrayObject *)item;
        Snapshot *s = &self->params[i];
        Py_INCREF(a);
        s->array = a;
        s->data = PyArray_DATA(a);
        s->descr = PyArray_DESCR(a);
        Py_INCREF(s->descr);
        s->ndim = PyArray_NDIM(a);
        s->nbytes = PyArray_NBYTES(a);
        memcpy(s->dims, PyArray_DIMS(a), s->ndim * sizeof(npy_intp));
        memcpy(s->strides, PyArray_STRIDES(a), s->ndim * sizeof(npy_intp));
    }
    Py_DECREF(seq);
    for (Py_ssize_t i = 0; i < self->n_feeds; i++) {
        Snapshot *s = &self->params[self->feeds[i].param];
        int type = s->array ? s->descr->type_num : -1;
        if (!s->array || s->ndim != 0 || (type != NPY_FLOAT && type != NPY_DOUBLE)) {
            forget_params(self); /* a feed this code cannot write: the checked path refreshes it */
            break;
        }
    }
    Py_RETURN_NONE;
}

/* Read outputs ((shape, dtype), ...) and words (first descriptor word of each) into a table
 * of n entries; NULL with an exception if they do not fit. */
static OutputSpec *output_specs(PyObject *outputs, PyObject *words, Py_ssize_t *n) {
    *n = PyTuple_GET_SIZE(outputs);
    if (PyTuple_GET_SIZE(words) != *n) {
        PyErr_SetString(PyExc_ValueError, "bind_workspace: one descriptor word per output");
        return NULL;
    }
    OutputSpec *table = PyMem_Calloc(*n + 1, sizeof(OutputSpec));
    if (!table) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t k = 0; k < *n; k++) {
        OutputSpec *o = &table[k];
        PyObject *shape, *dtype;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(outputs, k), "O!O", &PyTuple_Type, &shape, &dtype) ||
            !PyArray_DescrConverter(dtype, &o->descr)) {
            goto fail;
        }
        o->ndim = (int)PyTuple_GET_SIZE(shape);
        o->word = PyLong_AsSsize_t(PyTuple_GET_ITEM(words, k));
        if (o->ndim > MAX_RANK || (o->word == -1 && PyErr_Occurred())) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "bind_workspace: an output of too high a rank");
            }
            goto fail;
        }
        for (int d = 0; d < o->ndim; d++) {
            o->dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
            if (o->dims[d] < 0) {
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_ValueError, "bind_workspace: output sizes must be >= 0");
                }
                goto fail;
            }
        }
    }
    return table;
fail:
    for (Py_ssize_t k = 0; k < *n; k++) {
        Py_CLEAR(table[k].descr);
    }
    PyMem_Free(table);
    return NULL;
}

/* bind_workspace(batch, buffer, outputs, words) or bind_workspace(None): the workspace the
 * step now uses, and the outputs' shapes and dtypes at that batch size ((shape, dtype), ...)
 * with the first descriptor word of each. */
static PyObject *ThinCall_bind_workspace(ThinCall *self, PyObject *args) {
    PyObject *batch, *buffer = NULL, *outputs = NULL, *words = NULL;
    if (!PyArg_ParseTuple(args, "O|OO!O!", &batch, &buffer, &PyTuple_Type, &outputs, &PyTuple_Type, &words)) {
        return NULL;
    }
    forget_workspace(self);
    if (batch == Py_None) {
        Py_RETURN_NONE;
    }
    if (!buffer || !outputs || !words || !PyArray_Check(buffer) || PyArray_NBYTES((PyArrayObject *)buffer) < HEADER) {
        PyErr_SetString(PyExc_TypeError,
                        "bind_workspace(batch, buffer, outputs, words): buffer must hold the header");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(batch);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n < 1) { /* check_inputs answers -1 for arguments it cannot take: no bound batch may equal it */
        PyErr_SetString(PyExc_ValueError, "bind_workspace: the batch size must be positive");
        return NULL;
    }
    Py_ssize_t count;
    OutputSpec *specs = output_specs(outputs, words, &count);
    if (!specs) {
        return NULL;
    }
    Py_INCREF(buffer);
    self->workspace = buffer;
    self->status = (int32_t *)PyArray_DATA((PyArrayObject *)buffer);
    self->outputs = specs;
    self->n_outputs = count;
    self->batch = n;
    Py_RETURN_NONE;
}

/* call_native(): the step on the bound descriptors (the caller holds the lock). */
static PyObject *ThinCall_call_native(ThinCall *self, PyObject *unused) {
    call_native(self);
    Py_RETURN_NONE;
}

/* status(): the status word of the bound workspace. */
static PyObject *ThinCall_status(ThinCall *self, PyObject *unused) {
    if (!self->status) {
        PyErr_SetString(PyExc_RuntimeError, "no workspace bound");
        return NULL;
    }
    return PyLong_FromLong(*self->status);
}

/* unbind(): forget the parameters and the workspace: the next call takes the checked path. */
static PyObject *ThinCall_unbind(ThinCall *self, PyObject *unused) {
    forget_params(self);
    forget_workspace(self);
    Py_RETURN_NONE;
}

/* after_fork(): a new lock (another thread of the parent may have held this one) and unbind(). */
static PyObject *ThinCall_after_fork(ThinCall *self, PyObject *unused) {
    self->lock = PyThread_allocate_lock(); /* the old one is leaked: it may be held forever */
    if (!self->lock) {
        return PyErr_NoMemory();
    }
    return ThinCall_unbind(self, NULL);
}

static PyObject *ThinCall_enter(ThinCall *self, PyObject *unused) {
    lock(self);
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *ThinCall_exit(ThinCall *self, PyObject *args) {
    unlock(self);
    Py_RETURN_FALSE;
}

static PyMethodDef ThinCall_methods[] = {
    {"run", (PyCFunction)ThinCall_run, METH_VARARGS, "run(inputs, params): outputs, or None for the checked path"},
    {"run_captured", (PyCFunction)ThinCall_run_captured, METH_O, "run_captured(inputs): run with the watched tensors"},
    {"watch", (PyCFunction)ThinCall_watch, METH_VARARGS, "watch(tensors, data_name, feeds)"},
    {"bind_params", (PyCFunction)ThinCall_bind_params, METH_O, "snapshot the bound parameter arrays"},
    {"bind_workspace", (PyCFunction)ThinCall_bind_workspace, METH_VARARGS,
     "bind_workspace(batch, buffer, outputs, words)"},
    {"call_native", (PyCFunction)ThinCall_call_native, METH_NOARGS, "the native call (lock held)"},
    {"status", (PyCFunction)ThinCall_status, METH_NOARGS, "the bound workspace's status word"},
    {"unbind", (PyCFunction)ThinCall_unbind, METH_NOARGS, "forget parameters and workspace"},
    {"after_fork", (PyCFunction)ThinCall_after_fork, METH_NOARGS, "a fresh lock, nothing bound"},
    {"__enter__", (PyCFunction)ThinCall_enter, METH_NOARGS, "take the lock"},
    {"__exit__", (PyCFunction)ThinCall_exit, METH_VARARGS, "release the lock"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ThinCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_thin_call.ThinCall",
    .tp_basicsize = sizeof(ThinCall),
    .tp_dealloc = (destructor)ThinCall_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One compiled step's checks, descriptor binding and native call",
    .tp_methods = ThinCall_methods,
    .tp_init = (initproc)ThinCall_init,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)ThinCall_traverse,
    .tp_clear = (inquiry)ThinCall_clear,
    .tp_free = PyObject_GC_Del,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_thin_call",
    .m_doc = "The thin call of compiled CPU steps",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__thin_call(void) {
    import_array();
    if (PyType_Ready(&ThinCallType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (!m) {
        return NULL;
    }
    Py_INCREF(&ThinCallType);
    if (PyModule_AddObject(m, "ThinCall", (PyObject *)&ThinCallType) < 0) {
        Py_DECREF(&ThinCallType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
