/*
 * tarproc._speedups: the hot loops of the tar reader and writer, for the common case only.
 *
 * scan(buf, pos, base, max_member_size, keyed[, views, refs, ref]) walks complete ustar/GNU/v7 headers of regular files in
 * `buf` starting at `pos` and returns (items, new_pos, nbytes). It stops -- returning what it has
 * -- at the first header it does not handle itself: any non-regular type, a checksum that does not
 * match the unsigned sum, a size that is not plain octal or is over the limit, an empty name, a name
 * ending in '/' (an old-style directory entry), or a
 * member whose data and padding are not entirely in `buf`. The Python parser (tarproc.tario) then
 * handles that header: it is the reference implementation and produces every error message.
 *
 * Items are (name, data, offset) or, with keyed=True, (key, field, data, offset), where offset
 * = base + position in buf (the stream offset of the member's header),
 * and keys follow the WebDataset key rule (key None and field = whole name when there is no key;
 * a leading "./" is not part of the key).
 * A member's data is a bytes copy; with views > 0 and buf a bytes object, data of views bytes or
 * more is a read-only memoryview of buf instead (no copy; it keeps buf alive while it lives).
 * With refs > 0, a member of refs bytes or more whose header is in buf but whose data runs past its
 * end is the last item: its data is ref(data_offset, size) (tario.FileRange: the data is left in
 * the file) and new_pos is past the end of buf, where the next header is; the caller moves the
 * stream there and checks that the data and padding were all there.
 *
 * pack(buf, used, members, start, templates, direct) is the writer's per-member work and
 * members(sample) its per-sample work (see them below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* Parse a NUL/space-terminated octal field; -1 if it is not plain octal. */
static long long parse_octal(const unsigned char *f, int width)
{
    int i = 0;
    long long v = 0;
    int digits = 0;
    while (i < width && f[i] == ' ')
        i++;
    for (; i < width; i++) {
        unsigned char c = f[i];
        if (c >= '0' && c <= '7') {
            if (v > (1LL << 58))
                return -1;
            v = v * 8 + (c - '0');
            digits++;
        } else if (c == 0 || c == ' ') {
            break;
        } else {
            return -1;
        }
    }
    /* anything after the terminator must be NUL or space */
    for (; i < width; i++)
        if (f[i] != 0 && f[i] != ' ')
            return -1;
    return digits ? v : (f[0] == 0 || f[0] == ' ' ? 0 : -1);
}

static PyObject *decode(const unsigned char *p, Py_ssize_t n)
{
    return PyUnicode_DecodeUTF8((const char *)p, n, "surrogateescape");
}

static PyObject *decode_lower(const unsigned char *p, Py_ssize_t n)
{
    int needs = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if ((p[i] >= 'A' && p[i] <= 'Z') || p[i] >= 0x80) {
            needs = 1;
            break;
        }
    PyObject *s = decode(p, n);
    if (s == NULL || !needs)
        return s;
    PyObject *low = PyObject_CallMethod(s, "lower", NULL);
    Py_DECREF(s);
    return low;
}

static PyObject *scan(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos;
    long long base, max_size;
    int keyed;
    Py_ssize_t views = 0, refs = 0;
    PyObject *ref = Py_None;
    if (!PyArg_ParseTuple(args, "y*nLLp|nnO", &view, &pos, &base, &max_size, &keyed, &views, &refs, &ref))
        return NULL;
    if (ref == Py_None)
        refs = 0;
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len;
    long long nbytes = 0;
    unsigned char name[256 + 2];
    PyObject *whole = NULL; /* a memoryview of all of buf, sliced for each member given as a view */
    if (views > 0 && !PyBytes_CheckExact(view.obj))
        views = 0; /* only an immutable buffer can be shared */
    PyObject *items = PyList_New(0);
    if (items == NULL)
        goto fail;

    while (pos >= 0 && pos + 512 <= n) {
        const unsigned char *h = buf + pos;
        unsigned char tf = h[156];
        if (tf != '0' && tf != 0 && tf != '7')
            break;
        long long stored = parse_octal(h + 148, 8);
        if (stored < 0)
            break;
        long long sum = 8 * ' ';
        for (int i = 0; i < 148; i++)
            sum += h[i];
        for (int i = 156; i < 512; i++)
            sum += h[i];
        if (sum != stored)
            break;
        if (h[124] & 0x80)
            break;
        long long size = parse_octal(h + 124, 12);
        if (size < 0 || size > max_size)
            break;
        long long padded = (size + 511) & ~511LL;
        int as_ref = 0; /* the data runs past buf: with refs, it is left where it is (the last item) */
        if (pos + 512 + padded > n) {
            if (refs <= 0 || size < refs)
                break;
            as_ref = 1;
        }

        /* name, with the ustar prefix when the POSIX magic says there is one */
        Py_ssize_t nlen = (Py_ssize_t)strnlen((const char *)h, 100);
        if (nlen == 0)
            break;
        const unsigned char *np = h;
        if (memcmp(h + 257, "ustar\0", 6) == 0 && h[345] != 0) {
            Py_ssize_t plen = (Py_ssize_t)strnlen((const char *)h + 345, 155);
            memcpy(name, h + 345, plen);
            name[plen] = '/';
            memcpy(name + plen + 1, h, nlen);
            nlen += plen + 1;
            np = name;
        }

        if (np[nlen - 1] == '/')
            break; /* an old-style directory entry: the Python parser reads it */

        PyObject *data;
        if (as_ref) {
            data = PyObject_CallFunction(ref, "LL", base + (long long)pos + 512, size);
        } else if (views > 0 && size >= views) {
            if (whole == NULL && (whole = PyMemoryView_FromObject(view.obj)) == NULL)
                goto fail;
            data = PySequence_GetSlice(whole, pos + 512, pos + 512 + (Py_ssize_t)size);
        } else {
            data = PyBytes_FromStringAndSize((const char *)h + 512, (Py_ssize_t)size);
        }
        PyObject *off = PyLong_FromLongLong(base + (long long)pos);
        PyObject *item = NULL;
        if (data == NULL || off == NULL) {
            Py_XDECREF(data);
            Py_XDECREF(off);
            goto fail;
        }
        if (keyed) {
            Py_ssize_t slash = -1, dot = -1;
            for (Py_ssize_t i = nlen - 1; i >= 0; i--)
                if (np[i] == '/') {
                    slash = i;
                    break;
                }
            for (Py_ssize_t i = slash + 1; i < nlen; i++)
                if (np[i] == '.') {
                    dot = i;
                    break;
                }
            PyObject *key, *field;
            if (dot <= slash + 1) {
                key = Py_None;
                Py_INCREF(key);
                field = decode(np, nlen);
            } else {
                Py_ssize_t start = 0; /* without the leading "./" of 'tar -C dir .' */
                while (start + 1 < dot && np[start] == '.' && np[start + 1] == '/')
                    start += 2;
                key = decode(np + start, dot - start);
                field = decode_lower(np + dot + 1, nlen - dot - 1);
            }
            if (key == NULL || field == NULL) {
                Py_XDECREF(key);
                Py_XDECREF(field);
                Py_DECREF(data);
                Py_DECREF(off);
                goto fail;
            }
            item = PyTuple_Pack(4, key, field, data, off);
            Py_DECREF(key);
            Py_DECREF(field);
        } else {
            PyObject *nm = decode(np, nlen);
            if (nm == NULL) {
                Py_DECREF(data);
                Py_DECREF(off);
                goto fail;
            }
            item = PyTuple_Pack(3, nm, data, off);
            Py_DECREF(nm);
        }
        Py_DECREF(data);
        Py_DECREF(off);
        if (item == NULL)
            goto fail;
        if (PyList_Append(items, item) < 0) {
            Py_DECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        nbytes += size;
        pos += 512 + padded;
        if (as_ref)
            break; /* pos is past the end of buf: the caller moves the stream past that data */
    }
    Py_XDECREF(whole);
    PyBuffer_Release(&view);
    return Py_BuildValue("NnL", items, pos, nbytes);

fail:
    Py_XDECREF(whole);
    Py_XDECREF(items);
    PyBuffer_Release(&view);
    return NULL;
}

/* tario.FileRange, once tario has registered it (set_range_type): member data left in a file. */
static PyObject *range_type = NULL;

static PyObject *set_range_type(PyObject *self, PyObject *type)
{
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "set_range_type: a type");
        return NULL;
    }
    Py_INCREF(type);
    Py_XSETREF(range_type, type);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------
 * The writer: tarproc.tario.TarWriter is the reference; this does the same for the common case.
 *
 * pack(buf, used, members, start, templates, direct) -> (used, next, status)
 *
 * Writes members[start:] -- (name: str, data: bytes | bytearray | memoryview) tuples -- into the
 * writable buffer `buf` from offset `used` on: header(s), data, zero padding to 512 bytes. The
 * headers are TarWriter's: a ustar header where the UTF-8 name fits 100 bytes or splits at a slash
 * into a 155-byte prefix and a 100-byte name (the same split as tario._split_ustar), else a GNU
 * ././@LongLink record (the name and a NUL, padded) before a header holding the name's first 100
 * bytes. `templates` holds TarWriter's three header kinds, 512 bytes each, with every constant
 * field (mode, owner, mtime, typeflag, magic) filled in, an empty name and prefix and the checksum
 * field as 8 spaces: ustar "0", GNU "0", and the GNU "L" header with its name. This fills in name,
 * prefix and size and then the checksum, the unsigned sum of the 512 bytes.
 *
 * It stops at the first member it can't finish, saying why in `status`; `next` is that member:
 *   PACK_DONE   every member is written (next == len(members));
 *   PACK_FULL   members[next] does not fit in what is left of buf: write buf[:used] out, call again;
 *   PACK_PYTHON members[next] is for the Python writer, which writes it or raises the error: not a
 *               (str, bytes-like) pair, a name that is empty, holds a NUL or is not valid UTF-8
 *               (lone surrogates: Python's surrogateescape), data that is not one contiguous
 *               buffer, or headers that do not fit even an empty buf;
 *   PACK_BIG    members[next] has `direct` bytes of data or more, or data left in a file (a
 *               tario.FileRange, see set_range_type): its header(s) are in buf, and the
 *               caller writes buf[:used], then the data itself (not copied) and its padding.
 */
enum { PACK_DONE = 0, PACK_FULL = 1, PACK_PYTHON = 2, PACK_BIG = 3 };

#define PADDED(n) (((n) + 511) & ~(Py_ssize_t)511)

/* Where a name of n bytes (over 100) splits into a ustar prefix and name: the slash's index, or
 * -1 when it can't. The first slash that leaves a name of 1..100 bytes and a prefix of 1..155. */
static Py_ssize_t split_ustar(const char *raw, Py_ssize_t n)
{
    if (n > 256)
        return -1;
    Py_ssize_t from = n > 101 ? n - 101 : 0;
    const char *slash = memchr(raw + from, '/', (size_t)(n - from));
    while (slash != NULL) {
        Py_ssize_t i = slash - raw;
        if (i <= 0 || i > 155)
            return -1;
        if (n - i - 1 <= 100 && n - i - 1 > 0)
            return i;
        slash = memchr(raw + i + 1, '/', (size_t)(n - i - 1));
    }
    return -1;
}

/* One header at h: the template, then name, prefix, size and the checksum. */
static void put_header(unsigned char *h, const unsigned char *tmpl, const char *name, Py_ssize_t nlen,
                       const char *prefix, Py_ssize_t plen, unsigned long long size)
{
    memcpy(h, tmpl, 512);
    memcpy(h, name, (size_t)nlen);
    if (plen)
        memcpy(h + 345, prefix, (size_t)plen);
    if (size < (1ULL << 33)) { /* 11 octal digits and a NUL */
        for (int i = 10; i >= 0; i--) {
            h[124 + i] = (unsigned char)('0' + (size & 7));
            size >>= 3;
        }
        h[135] = 0;
    } else { /* base-256: 0x80, then 11 bytes big-endian */
        h[124] = 0x80;
        for (int i = 11; i >= 1; i--) {
            h[124 + i] = (unsigned char)(size & 0xFF);
            size >>= 8;
        }
    }
    unsigned int sum = 0; /* the template's checksum field is 8 spaces */
    for (int i = 0; i < 512; i++)
        sum += h[i];
    for (int i = 5; i >= 0; i--) { /* "%06o\0 " */
        h[148 + i] = (unsigned char)('0' + (sum & 7));
        sum >>= 3;
    }
    h[154] = 0;
    h[155] = ' ';
}

static PyObject *pack(PyObject *self, PyObject *args)
{
    Py_buffer out, tm;
    Py_ssize_t used, start, direct;
    PyObject *members;
    if (!PyArg_ParseTuple(args, "w*nOny*n", &out, &used, &members, &start, &tm, &direct))
        return NULL;
    PyObject *seq = NULL;
    if (tm.len != 3 * 512 || used < 0 || used > out.len || start < 0) {
        PyErr_SetString(PyExc_ValueError, "pack: bad templates, used or start");
        goto fail;
    }
    seq = PySequence_Fast(members, "pack: members must be a list or a tuple");
    if (seq == NULL)
        goto fail;
    const unsigned char *ustar = tm.buf, *gnu = ustar + 512, *longlink = ustar + 1024;
    unsigned char *buf = out.buf;
    Py_ssize_t cap = out.len;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int status = PACK_DONE;
    Py_ssize_t i;

    for (i = start; i < count; i++) {
        PyObject *item = items[i];
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            status = PACK_PYTHON;
            break;
        }
        PyObject *name = PyTuple_GET_ITEM(item, 0), *data = PyTuple_GET_ITEM(item, 1);
        /* data left in a file (tario.FileRange) is written by the caller, as big data is */
        int is_range = range_type != NULL && (PyObject *)Py_TYPE(data) == range_type;
        if (!PyUnicode_Check(name) ||
            !(is_range || PyBytes_Check(data) || PyByteArray_Check(data) || PyMemoryView_Check(data))) {
            status = PACK_PYTHON;
            break;
        }
        Py_ssize_t nlen;
        const char *raw = PyUnicode_AsUTF8AndSize(name, &nlen);
        if (raw == NULL) { /* lone surrogates: the Python writer encodes them */
            PyErr_Clear();
            status = PACK_PYTHON;
            break;
        }
        if (nlen == 0 || memchr(raw, 0, (size_t)nlen) != NULL) {
            status = PACK_PYTHON;
            break;
        }
        Py_buffer dv = {0};
        Py_ssize_t size;
        if (is_range) {
            if ((size = PyObject_Size(data)) < 0)
                goto fail;
        } else {
            if (PyObject_GetBuffer(data, &dv, PyBUF_SIMPLE) < 0) { /* not contiguous, or released */
                PyErr_Clear();
                status = PACK_PYTHON;
                break;
            }
            size = dv.len;
        }
        Py_ssize_t split = nlen > 100 ? split_ustar(raw, nlen) : -1;
        int long_name = nlen > 100 && split < 0;
        Py_ssize_t head = long_name ? 512 + PADDED(nlen + 1) + 512 : 512;
        int big = is_range || size >= direct;
        if (head + (big ? 0 : PADDED(size)) > cap - used) {
            if (!is_range)
                PyBuffer_Release(&dv);
            status = used == 0 ? PACK_PYTHON : PACK_FULL;
            break;
        }
        unsigned char *h = buf + used;
        if (long_name) {
            Py_ssize_t record = PADDED(nlen + 1);
            put_header(h, longlink, "", 0, "", 0, (unsigned long long)(nlen + 1));
            memcpy(h + 512, raw, (size_t)nlen);
            memset(h + 512 + nlen, 0, (size_t)(record - nlen));
            put_header(h + 512 + record, gnu, raw, 100, "", 0, (unsigned long long)size);
        } else if (split >= 0) {
            put_header(h, ustar, raw + split + 1, nlen - split - 1, raw, split, (unsigned long long)size);
        } else {
            put_header(h, ustar, raw, nlen, "", 0, (unsigned long long)size);
        }
        used += head;
        if (big) {
            if (!is_range)
                PyBuffer_Release(&dv);
            status = PACK_BIG;
            break;
        }
        memcpy(buf + used, dv.buf, (size_t)size);
        memset(buf + used + size, 0, (size_t)(PADDED(size) - size));
        used += PADDED(size);
        PyBuffer_Release(&dv);
    }
    Py_DECREF(seq);
    PyBuffer_Release(&out);
    PyBuffer_Release(&tm);
    return Py_BuildValue("nni", used, i, status);

fail:
    Py_XDECREF(seq);
    PyBuffer_Release(&out);
    PyBuffer_Release(&tm);
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * members(sample) -> (key, [(name, value), ...]) or None: tario.sample_members for the common
 * case, where that gives the same without raising: a dict whose "__key__" is a str that passes
 * tario.check_key, whose fields are str of ASCII without upper case, '/' or NUL (so no two can
 * differ only in case), at least one of them not starting with "__" (those are skipped), and
 * whose values are bytes (or what encode_value passes on as it is: a memoryview of single bytes, a
 * tario.FileRange). Members are "KEY.FIELD" in sorted field order. None for anything else:
 * the Python function then does it, or raises the error it names.
 */

/* check_key's rules on the key's UTF-8 bytes ('/', '.', '_' and NUL are never part of a
 * multi-byte character, so the bytes answer as the characters would). */
static int key_ok(const char *k, Py_ssize_t n)
{
    if (n == 0 || memchr(k, 0, (size_t)n) != NULL)
        return 0;
    if (n >= 2 && k[0] == '.' && k[1] == '/')
        return 0;
    Py_ssize_t base = n;
    while (base > 0 && k[base - 1] != '/')
        base--;
    if (base == n || memchr(k + base, '.', (size_t)(n - base)) != NULL)
        return 0;
    const char *slash = memchr(k, '/', (size_t)n);
    Py_ssize_t first = slash != NULL ? slash - k : n;
    if (first > 4 && k[0] == '_' && k[1] == '_' && k[first - 2] == '_' && k[first - 1] == '_')
        return 0; /* __name__: metadata (4 bytes or fewer are ASCII, so bytes count as characters) */
    return 1;
}

static int field_ok(PyObject *field)
{
    if (!PyUnicode_CheckExact(field) || !PyUnicode_IS_ASCII(field))
        return 0;
    const char *f = (const char *)PyUnicode_1BYTE_DATA(field);
    Py_ssize_t n = PyUnicode_GET_LENGTH(field);
    for (Py_ssize_t i = 0; i < n; i++)
        if ((f[i] >= 'A' && f[i] <= 'Z') || f[i] == '/' || f[i] == 0)
            return 0;
    return 1;
}

/* A memoryview that encode_value gives back as it is: one dimension of single bytes, contiguous. */
static int byte_view(PyObject *value)
{
    if (!PyMemoryView_Check(value))
        return 0;
    Py_buffer *b = PyMemoryView_GET_BUFFER(value);
    return b->buf != NULL && b->itemsize == 1 && b->ndim == 1 && PyBuffer_IsContiguous(b, 'C');
}

static PyObject *members(PyObject *self, PyObject *sample)
{
    if (!PyDict_CheckExact(sample))
        Py_RETURN_NONE;
    PyObject *key = PyDict_GetItemString(sample, "__key__"); /* borrowed */
    if (key == NULL || !PyUnicode_CheckExact(key))
        Py_RETURN_NONE;
    Py_ssize_t klen;
    const char *k = PyUnicode_AsUTF8AndSize(key, &klen);
    if (k == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (!key_ok(k, klen))
        Py_RETURN_NONE;
    PyObject *fields = PyDict_Keys(sample);
    if (fields == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(fields);
    for (Py_ssize_t i = 0; i < n; i++)
        if (!field_ok(PyList_GET_ITEM(fields, i))) {
            Py_DECREF(fields);
            Py_RETURN_NONE;
        }
    PyObject *out = NULL, *prefix = NULL;
    if (PyList_Sort(fields) < 0)
        goto done;
    prefix = PyUnicode_FromFormat("%U.", key);
    out = PyList_New(0);
    if (prefix == NULL || out == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *field = PyList_GET_ITEM(fields, i);
        const char *f = (const char *)PyUnicode_1BYTE_DATA(field);
        if (PyUnicode_GET_LENGTH(field) >= 2 && f[0] == '_' && f[1] == '_')
            continue;
        PyObject *value = PyDict_GetItemWithError(sample, field); /* borrowed */
        if (value == NULL) {
            if (PyErr_Occurred())
                goto fail;
            goto none; /* cannot happen: the field came from the dict */
        }
        if (!PyBytes_CheckExact(value) && !byte_view(value) &&
            !(range_type != NULL && (PyObject *)Py_TYPE(value) == range_type))
            goto none; /* encode_value's work: the Python function does it */
        PyObject *name = PyUnicode_Concat(prefix, field);
        if (name == NULL)
            goto fail;
        PyObject *pair = PyTuple_Pack(2, name, value);
        Py_DECREF(name);
        if (pair == NULL)
            goto fail;
        int err = PyList_Append(out, pair);
        Py_DECREF(pair);
        if (err < 0)
            goto fail;
    }
    if (PyList_GET_SIZE(out) == 0)
        goto none; /* no fields: the Python function names the error */
    PyObject *result = PyTuple_Pack(2, key, out);
    Py_DECREF(out);
    Py_DECREF(prefix);
    Py_DECREF(fields);
    return result;

none:
    Py_XDECREF(out);
    Py_XDECREF(prefix);
    Py_DECREF(fields);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(out);
    out = NULL;
done:
    Py_XDECREF(prefix);
    Py_DECREF(fields);
    return out;
}

static PyMethodDef methods[] = {
    {"members", members, METH_O, "members(sample) -> (key, [(name, value), ...]) or None: sample_members' common case"},
    {"scan", scan, METH_VARARGS,
     "scan(buf, pos, base, max_member_size, keyed[, views, refs, ref]) -> (items, new_pos, nbytes)"},
    {"set_range_type", set_range_type, METH_O, "set_range_type(tario.FileRange): data that pack and members pass on"},
    {"pack", pack, METH_VARARGS, "pack(buf, used, members, start, templates, direct) -> (used, next, status)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", "Fast paths of the tar reader and writer.", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
