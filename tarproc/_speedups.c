/*
 * tarproc._speedups: the hot loop of the tar reader, for the common case only.
 *
 * scan(buf, pos, base, max_member_size, keyed) walks complete ustar/GNU/v7 headers of regular files in
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
    if (!PyArg_ParseTuple(args, "y*nLLp", &view, &pos, &base, &max_size, &keyed))
        return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len;
    long long nbytes = 0;
    unsigned char name[256 + 2];
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
        if (pos + 512 + padded > n)
            break;

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

        PyObject *data = PyBytes_FromStringAndSize((const char *)h + 512, (Py_ssize_t)size);
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
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("NnL", items, pos, nbytes);

fail:
    Py_XDECREF(items);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "scan(buf, pos, base, max_member_size, keyed) -> (items, new_pos, nbytes)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", "Fast path of the tar reader.", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
