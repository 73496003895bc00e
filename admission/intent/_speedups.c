/*
 * admission._speedups: an optional C accelerator for the canonical encoding
 * `intent-v1` (docs/encoding.md, contract section 3).
 *
 * The pure-Python walk in admission/intent/_encoding.py is the definition of the
 * bytes; this module only produces the same bytes faster.  It does not
 * explain refusals: on any refusal encode() returns None and the caller
 * re-runs the Python encoder, which raises the precise InvalidValueError
 * (path, reason, offset).  So the only obligations here are
 *
 *   - for every value the Python encoder accepts, return identical bytes;
 *   - for every value the Python encoder refuses, return None.
 *
 * Refusing *earlier* than Python is allowed when Python is bound to refuse
 * too: the output is never allowed to grow past `limit` bytes (Python refuses
 * any value whose encoding is longer than `limit`), which also bounds the
 * memory used by shared-reference bombs such as x = [x, x] nested 60 deep.
 *
 * The walk calls no Python code: it dispatches on exact types only, reads
 * containers through the concrete-type macros, and allocates only raw memory
 * and non-GC objects (bytes, the cached UTF-8 of a str), so no finaliser or
 * garbage collection can run and mutate a container under it.  Dict entries
 * are nevertheless held by strong references while they are sorted and
 * written, and list lengths are re-read at every step, so that a future
 * change cannot turn that assumption into a use-after-free.
 *
 * The module holds no state.  It declares that it needs the GIL, because it
 * reads lists and dicts without per-object locks.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64           /* same as encoding.MAX_DEPTH */
#define INITIAL_CAPACITY 256
#define SMALL_MAP 16           /* entries sorted in a stack array, by insertion */

/* Results of the walk. */
#define ENC_OK 0
#define ENC_REFUSE 1           /* the value is not encodable: return None */
#define ENC_ERROR (-1)         /* a Python exception is set (MemoryError) */

typedef struct {
    PyObject *bytes;           /* the output, a bytes object over-allocated to `cap` */
    unsigned char *data;       /* PyBytes_AS_STRING(bytes) */
    Py_ssize_t len;
    Py_ssize_t cap;
    Py_ssize_t limit;          /* len may never exceed this */
} Buffer;

/* Make room for `n` more bytes.  Refuses if that would pass the limit. */
static int
buffer_reserve(Buffer *b, Py_ssize_t n)
{
    if (n > b->limit - b->len) {
        return ENC_REFUSE;
    }
    Py_ssize_t need = b->len + n;      /* <= limit: no overflow */
    if (need <= b->cap) {
        return ENC_OK;
    }
    Py_ssize_t cap = b->cap;
    while (cap < need) {
        cap = (cap > PY_SSIZE_T_MAX / 2) ? PY_SSIZE_T_MAX : cap * 2;
    }
    if (cap > b->limit) {
        cap = b->limit;                /* never allocate more than can be used */
    }
    if (_PyBytes_Resize(&b->bytes, cap) < 0) {
        /* _PyBytes_Resize freed the object and set b->bytes to NULL. */
        b->data = NULL;
        return ENC_ERROR;
    }
    b->data = (unsigned char *)PyBytes_AS_STRING(b->bytes);
    b->cap = cap;
    return ENC_OK;
}

#define RESERVE(b, n)                              \
    do {                                           \
        int r_ = buffer_reserve((b), (n));         \
        if (r_ != ENC_OK) {                        \
            return r_;                             \
        }                                          \
    } while (0)

/* Size of the head of an item with argument n (RFC 8949 section 4.2.1). */
static inline Py_ssize_t
head_size(uint64_t n)
{
    if (n < 24) {
        return 1;
    }
    if (n < 0x100) {
        return 2;
    }
    if (n < 0x10000) {
        return 3;
    }
    if (n < 0x100000000ULL) {
        return 5;
    }
    return 9;
}

/* Write the head; room must have been reserved. */
static inline void
put_head(Buffer *b, unsigned int major, uint64_t n)
{
    unsigned char *p = b->data + b->len;
    unsigned char mt = (unsigned char)(major << 5);
    if (n < 24) {
        p[0] = (unsigned char)(mt | n);
        b->len += 1;
    }
    else if (n < 0x100) {
        p[0] = mt | 24;
        p[1] = (unsigned char)n;
        b->len += 2;
    }
    else if (n < 0x10000) {
        p[0] = mt | 25;
        p[1] = (unsigned char)(n >> 8);
        p[2] = (unsigned char)n;
        b->len += 3;
    }
    else if (n < 0x100000000ULL) {
        p[0] = mt | 26;
        p[1] = (unsigned char)(n >> 24);
        p[2] = (unsigned char)(n >> 16);
        p[3] = (unsigned char)(n >> 8);
        p[4] = (unsigned char)n;
        b->len += 5;
    }
    else {
        p[0] = mt | 27;
        for (int i = 0; i < 8; i++) {
            p[1 + i] = (unsigned char)(n >> (56 - 8 * i));
        }
        b->len += 9;
    }
}

static int
write_head(Buffer *b, unsigned int major, uint64_t n)
{
    RESERVE(b, head_size(n));
    put_head(b, major, n);
    return ENC_OK;
}

/* A head followed by `n` raw bytes (text already in UTF-8, or a byte string). */
static int
write_string(Buffer *b, unsigned int major, const char *s, Py_ssize_t n)
{
    Py_ssize_t h = head_size((uint64_t)n);
    if (n > PY_SSIZE_T_MAX - h) {
        return ENC_REFUSE;
    }
    RESERVE(b, h + n);
    put_head(b, major, (uint64_t)n);
    memcpy(b->data + b->len, s, (size_t)n);
    b->len += n;
    return ENC_OK;
}

static inline int
ensure_ready(PyObject *s)
{
#if PY_VERSION_HEX < 0x030C0000
    /* Strings made through the legacy wstr API may not be ready on 3.11. */
    if (PyUnicode_READY(s) < 0) {
        return -1;
    }
#else
    (void)s;
#endif
    return 0;
}

/*
 * A str value, encoded straight from its internal representation so that the
 * encoder does not attach a cached UTF-8 copy to every string it is given.
 * Any code point in U+D800..U+DFFF is a lone surrogate (a Python str never
 * pairs them), which str.encode("utf-8") refuses, so it is refused here.
 */
static int
encode_text(Buffer *b, PyObject *s)
{
    if (ensure_ready(s) < 0) {
        PyErr_Clear();
        return ENC_REFUSE;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (PyUnicode_IS_ASCII(s)) {
        return write_string(b, 3, (const char *)PyUnicode_1BYTE_DATA(s), n);
    }
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t size = 0;               /* number of UTF-8 bytes */
    Py_ssize_t i;
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *u = (const Py_UCS1 *)data;
        for (i = 0; i < n; i++) {
            size += 1 + (u[i] >> 7);
        }
    }
    else if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *u = (const Py_UCS2 *)data;
        for (i = 0; i < n; i++) {
            Py_UCS2 c = u[i];
            if (c < 0x80) {
                size += 1;
            }
            else if (c < 0x800) {
                size += 2;
            }
            else if (c >= 0xD800 && c <= 0xDFFF) {
                return ENC_REFUSE;
            }
            else {
                size += 3;
            }
        }
    }
    else {
        const Py_UCS4 *u = (const Py_UCS4 *)data;
        for (i = 0; i < n; i++) {
            Py_UCS4 c = u[i];
            if (c < 0x80) {
                size += 1;
            }
            else if (c < 0x800) {
                size += 2;
            }
            else if (c < 0x10000) {
                if (c >= 0xD800 && c <= 0xDFFF) {
                    return ENC_REFUSE;
                }
                size += 3;
            }
            else {
                size += 4;
            }
        }
    }
    /* size <= 4 * n and n is at most PY_SSIZE_T_MAX / 4 for a str of that kind. */
    Py_ssize_t h = head_size((uint64_t)size);
    if (size > PY_SSIZE_T_MAX - h) {
        return ENC_REFUSE;
    }
    RESERVE(b, h + size);
    put_head(b, 3, (uint64_t)size);
    unsigned char *p = b->data + b->len;
    for (i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80) {
            *p++ = (unsigned char)c;
        }
        else if (c < 0x800) {
            *p++ = (unsigned char)(0xC0 | (c >> 6));
            *p++ = (unsigned char)(0x80 | (c & 0x3F));
        }
        else if (c < 0x10000) {
            *p++ = (unsigned char)(0xE0 | (c >> 12));
            *p++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
            *p++ = (unsigned char)(0x80 | (c & 0x3F));
        }
        else {
            *p++ = (unsigned char)(0xF0 | (c >> 18));
            *p++ = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
            *p++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
            *p++ = (unsigned char)(0x80 | (c & 0x3F));
        }
    }
    b->len += size;
    return ENC_OK;
}

static int
encode_int(Buffer *b, PyObject *o)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow != 0) {
        return ENC_REFUSE;             /* outside int64: bignums are refused */
    }
    if (v == -1 && PyErr_Occurred()) {
        return ENC_ERROR;              /* cannot happen for an exact int */
    }
    if (v >= 0) {
        return write_head(b, 0, (uint64_t)v);
    }
    /* -1 - v, computed without overflow for v == INT64_MIN. */
    return write_head(b, 1, ~(uint64_t)v);
}

static int
encode_float(Buffer *b, double d)
{
    unsigned char *p;
    if (isfinite(d)) {
        uint64_t bits;
        memcpy(&bits, &d, sizeof bits);
        RESERVE(b, 9);
        p = b->data + b->len;
        p[0] = 0xFB;
        for (int i = 0; i < 8; i++) {
            p[1 + i] = (unsigned char)(bits >> (56 - 8 * i));
        }
        b->len += 9;
        return ENC_OK;
    }
    RESERVE(b, 3);
    p = b->data + b->len;
    p[0] = 0xF9;
    if (isnan(d)) {
        p[1] = 0x7E;                   /* every NaN is f97e00 */
    }
    else {
        p[1] = d > 0 ? 0x7C : 0xFC;
    }
    p[2] = 0x00;
    b->len += 3;
    return ENC_OK;
}

/* One dict entry while its map is sorted: the key's UTF-8 bytes and strong references. */
typedef struct {
    const char *utf8;
    Py_ssize_t size;
    PyObject *key;
    PyObject *value;
} Entry;

/* Raw UTF-8 bytes, bytewise, a proper prefix first (= code-point order). */
static inline int
entry_cmp(const Entry *a, const Entry *b)
{
    Py_ssize_t n = a->size < b->size ? a->size : b->size;
    int c = memcmp(a->utf8, b->utf8, (size_t)n);
    if (c != 0) {
        return c;
    }
    return (a->size > b->size) - (a->size < b->size);
}

static int
entry_qsort_cmp(const void *a, const void *b)
{
    return entry_cmp((const Entry *)a, (const Entry *)b);
}

static void
sort_entries(Entry *e, Py_ssize_t n)
{
    if (n > SMALL_MAP) {
        qsort(e, (size_t)n, sizeof(Entry), entry_qsort_cmp);
        return;
    }
    for (Py_ssize_t i = 1; i < n; i++) {
        if (entry_cmp(&e[i - 1], &e[i]) <= 0) {
            continue;                  /* already in order: the common case */
        }
        Entry tmp = e[i];
        Py_ssize_t j = i;
        while (j > 0 && entry_cmp(&e[j - 1], &tmp) > 0) {
            e[j] = e[j - 1];
            j--;
        }
        e[j] = tmp;
    }
}

static int encode_item(Buffer *b, PyObject *o, int depth);

static int
encode_dict(Buffer *b, PyObject *d, int depth)
{
    Entry small[SMALL_MAP];
    Entry *entries = small;
    Py_ssize_t n = PyDict_GET_SIZE(d);
    Py_ssize_t count = 0;
    Py_ssize_t i;
    int r = write_head(b, 5, (uint64_t)n);
    if (r != ENC_OK) {
        return r;
    }
    if (n == 0) {
        return ENC_OK;
    }
    if (n > SMALL_MAP) {
        if ((size_t)n > PY_SSIZE_T_MAX / sizeof(Entry)) {
            PyErr_NoMemory();
            return ENC_ERROR;
        }
        entries = (Entry *)PyMem_Malloc((size_t)n * sizeof(Entry));
        if (entries == NULL) {
            PyErr_NoMemory();
            return ENC_ERROR;
        }
    }
    Py_ssize_t pos = 0;
    PyObject *key;
    PyObject *value;
    while (PyDict_Next(d, &pos, &key, &value)) {
        if (count >= n || !PyUnicode_CheckExact(key)) {
            r = ENC_REFUSE;            /* a non-str key (or a dict that grew) */
            goto done;
        }
        const char *utf8;
        Py_ssize_t size;
        if (ensure_ready(key) < 0) {
            PyErr_Clear();
            r = ENC_REFUSE;
            goto done;
        }
        if (PyUnicode_IS_ASCII(key)) {
            utf8 = (const char *)PyUnicode_1BYTE_DATA(key);
            size = PyUnicode_GET_LENGTH(key);
        }
        else {
            /* Cached on the key; raises UnicodeEncodeError on a lone surrogate. */
            utf8 = PyUnicode_AsUTF8AndSize(key, &size);
            if (utf8 == NULL) {
                PyErr_Clear();
                r = ENC_REFUSE;
                goto done;
            }
        }
        Py_INCREF(key);
        Py_INCREF(value);
        entries[count].utf8 = utf8;
        entries[count].size = size;
        entries[count].key = key;
        entries[count].value = value;
        count++;
    }
    if (count != n) {
        r = ENC_REFUSE;                /* the dict changed size: cannot happen, see above */
        goto done;
    }
    sort_entries(entries, count);
    depth += 1;
    for (i = 0; i < count; i++) {
        r = write_string(b, 3, entries[i].utf8, entries[i].size);
        if (r != ENC_OK) {
            goto done;
        }
        r = encode_item(b, entries[i].value, depth);
        if (r != ENC_OK) {
            goto done;
        }
    }
    r = ENC_OK;
done:
    for (i = 0; i < count; i++) {
        Py_DECREF(entries[i].key);
        Py_DECREF(entries[i].value);
    }
    if (entries != small) {
        PyMem_Free(entries);
    }
    return r;
}

static int
encode_item(Buffer *b, PyObject *o, int depth)
{
    PyTypeObject *t = Py_TYPE(o);
    int r;
    if (t == &PyUnicode_Type) {
        return encode_text(b, o);
    }
    if (t == &PyLong_Type) {
        return encode_int(b, o);
    }
    if (t == &PyDict_Type) {
        if (depth >= MAX_DEPTH) {
            return ENC_REFUSE;
        }
        return encode_dict(b, o, depth);
    }
    if (t == &PyList_Type) {
        if (depth >= MAX_DEPTH) {
            return ENC_REFUSE;
        }
        Py_ssize_t n = PyList_GET_SIZE(o);
        r = write_head(b, 4, (uint64_t)n);
        if (r != ENC_OK) {
            return r;
        }
        /* The list cannot change during the walk (no Python code runs); the
           length is re-read anyway so that a change can never read past it. */
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i >= PyList_GET_SIZE(o)) {
                return ENC_REFUSE;
            }
            r = encode_item(b, PyList_GET_ITEM(o, i), depth + 1);
            if (r != ENC_OK) {
                return r;
            }
        }
        return ENC_OK;
    }
    if (t == &PyTuple_Type) {
        if (depth >= MAX_DEPTH) {
            return ENC_REFUSE;
        }
        Py_ssize_t n = PyTuple_GET_SIZE(o);
        r = write_head(b, 4, (uint64_t)n);
        if (r != ENC_OK) {
            return r;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            r = encode_item(b, PyTuple_GET_ITEM(o, i), depth + 1);
            if (r != ENC_OK) {
                return r;
            }
        }
        return ENC_OK;
    }
    if (t == &PyFloat_Type) {
        return encode_float(b, PyFloat_AS_DOUBLE(o));
    }
    if (o == Py_True || o == Py_False) {
        RESERVE(b, 1);
        b->data[b->len++] = (o == Py_True) ? 0xF5 : 0xF4;
        return ENC_OK;
    }
    if (o == Py_None) {
        RESERVE(b, 1);
        b->data[b->len++] = 0xF6;
        return ENC_OK;
    }
    if (t == &PyBytes_Type) {
        return write_string(b, 2, PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o));
    }
    return ENC_REFUSE;                 /* any other type, subclasses included */
}

PyDoc_STRVAR(encode_doc,
"encode(value, limit, /)\n"
"--\n"
"\n"
"The canonical intent-v1 encoding of value, or None if it is refused.\n"
"\n"
"None means the pure-Python encoder refuses value too: re-run it for the\n"
"error.  limit is the most bytes the encoding may take (a non-negative int;\n"
"larger than the address space means unbounded).");

static PyObject *
speedups_encode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "encode() takes exactly 2 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *value = args[0];
    PyObject *limit_obj = args[1];
    if (!PyLong_Check(limit_obj)) {
        PyErr_SetString(PyExc_TypeError, "limit must be an int");
        return NULL;
    }
    int overflow = 0;
    long long raw_limit = PyLong_AsLongLongAndOverflow(limit_obj, &overflow);
    if (raw_limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow < 0 || (overflow == 0 && raw_limit < 0)) {
        PyErr_SetString(PyExc_ValueError, "limit must not be negative");
        return NULL;
    }
    /* No bytes object can be longer than PY_SSIZE_T_MAX anyway. */
    Py_ssize_t limit = (overflow > 0 || raw_limit > (long long)PY_SSIZE_T_MAX)
        ? PY_SSIZE_T_MAX : (Py_ssize_t)raw_limit;
    if (limit == 0) {
        Py_RETURN_NONE;                /* every item takes at least one byte */
    }

    Buffer b;
    b.cap = limit < INITIAL_CAPACITY ? limit : INITIAL_CAPACITY;
    b.bytes = PyBytes_FromStringAndSize(NULL, b.cap);
    if (b.bytes == NULL) {
        return NULL;
    }
    b.data = (unsigned char *)PyBytes_AS_STRING(b.bytes);
    b.len = 0;
    b.limit = limit;

    int r = encode_item(&b, value, 0);
    if (r != ENC_OK) {
        Py_XDECREF(b.bytes);
        if (r == ENC_ERROR) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    if (b.len != b.cap && _PyBytes_Resize(&b.bytes, b.len) < 0) {
        return NULL;
    }
    return b.bytes;
}

static PyMethodDef speedups_methods[] = {
    {"encode", (PyCFunction)(void (*)(void))speedups_encode, METH_FASTCALL, encode_doc},
    {NULL, NULL, 0, NULL},
};

/*
 * ADMISSION_PURE_PYTHON: when set to anything other than "" or "0", this
 * module refuses to load (ImportError), so admission.encoding falls back to
 * its pure-Python encoder.  For debugging, for comparing the two encoders and
 * for testing the fallback.  It is read here, at import, rather than in
 * encoding.py, which stays free of environment access.
 */
static int
speedups_exec(PyObject *module)
{
    (void)module;
    const char *pure = getenv("ADMISSION_PURE_PYTHON");
    if (pure != NULL && pure[0] != '\0' && strcmp(pure, "0") != 0) {
        PyErr_SetString(PyExc_ImportError,
                        "admission._speedups disabled by ADMISSION_PURE_PYTHON");
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot speedups_slots[] = {
    {Py_mod_exec, (void *)speedups_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_mod_gil
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
    {0, NULL},
};

PyDoc_STRVAR(module_doc,
"Optional C accelerator for admission.encoding; the pure-Python encoder is\n"
"the definition of the bytes and the fallback.");

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "admission._speedups",
    .m_doc = module_doc,
    .m_size = 0,
    .m_methods = speedups_methods,
    .m_slots = speedups_slots,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&speedups_module);
}
