/*
 * tarproc._speedups: the hot loops of the tar reader and writer, for the common case only.
 *
 * scan(buf, pos, base, max_member_size, keyed[, views, refs, ref]) walks complete ustar/GNU/v7 headers of regular files in
 * `buf` starting at `pos` and returns (items, new_pos, nbytes, last): last is the last item's
 * member name (None without items), which the reader names in the errors after it. It stops -- returning what it has
 * -- at the first header it does not handle itself: any non-regular type, a checksum that does not
 * match the unsigned sum, a size that is not plain octal or is over the limit, an empty name, a name
 * ending in '/' (an old-style directory entry), or a
 * member whose data and padding are not entirely in `buf`. The Python parser (tarproc/tar/reader.py) then
 * handles that header: it is the reference implementation and produces every error message.
 *
 * Items are (name, data, offset) or, with keyed=True, (key, field, data, offset), where offset
 * = base + position in buf (the stream offset of the member's header),
 * and keys follow the WebDataset key rule (key None and field = whole name when there is no key;
 * a leading "./" is not part of the key).
 * A member's data is a bytes copy; with views > 0 and buf a bytes object, data of views bytes or
 * more is a read-only memoryview of buf instead (no copy; it keeps buf alive while it lives).
 * With refs > 0, a member of refs bytes or more whose header is in buf but whose data runs past its
 * end is the last item: its data is ref(data_offset, size) (tar.FileRange: the data is left in
 * the file) and new_pos is past the end of buf, where the next header is; the caller moves the
 * stream there and checks that the data and padding were all there.
 *
 * pack(buf, used, members, start, templates, direct) is the writer's per-member work and
 * members(sample) its per-sample work (see them below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <errno.h>
#include <limits.h>
#include <unistd.h>

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

/* The field names of the last members scanned, decoded: most members reuse one of a few names,
 * and the same str object again spares decoding it and, in the dicts it is a key of, hashing it. */
#define FIELD_CACHE 8
#define FIELD_CACHE_MAX 32
static PyObject *field_cache[FIELD_CACHE];
static int field_cache_next;

static PyObject *decode_lower_uncached(const unsigned char *p, Py_ssize_t n);

static PyObject *decode_lower(const unsigned char *p, Py_ssize_t n)
{
    if (n > FIELD_CACHE_MAX)
        return decode_lower_uncached(p, n);
    for (int i = 0; i < FIELD_CACHE; i++) {
        PyObject *f = field_cache[i];
        if (f != NULL && PyUnicode_GET_LENGTH(f) == n && PyUnicode_IS_ASCII(f) &&
            memcmp(PyUnicode_1BYTE_DATA(f), p, (size_t)n) == 0) {
            Py_INCREF(f);
            return f;
        }
    }
    PyObject *f = decode_lower_uncached(p, n);
    if (f != NULL && PyUnicode_IS_ASCII(f) && PyUnicode_GET_LENGTH(f) == n &&
        memcmp(PyUnicode_1BYTE_DATA(f), p, (size_t)n) == 0) { /* already lower case, plain ASCII */
        Py_INCREF(f);
        Py_XSETREF(field_cache[field_cache_next], f);
        field_cache_next = (field_cache_next + 1) % FIELD_CACHE;
    }
    return f;
}

static PyObject *decode_lower_uncached(const unsigned char *p, Py_ssize_t n)
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

/* The member name in the header at h: the name field (not empty: the caller checks), after the
   ustar prefix and a '/' where the POSIX magic says there is one (copied into out, which holds
   258 bytes); *len is its length. */
static const unsigned char *member_name(const unsigned char *h, unsigned char *out, Py_ssize_t *len)
{
    Py_ssize_t nlen = (Py_ssize_t)strnlen((const char *)h, 100);
    if (memcmp(h + 257, "ustar\0", 6) != 0 || h[345] == 0) {
        *len = nlen;
        return h;
    }
    Py_ssize_t plen = (Py_ssize_t)strnlen((const char *)h + 345, 155);
    memcpy(out, h + 345, plen);
    out[plen] = '/';
    memcpy(out + plen + 1, h, nlen);
    *len = plen + 1 + nlen;
    return out;
}

/* The key rule (tar.split_key, in tar/headers.py): the index of the dot that ends the key -- the first dot of the
   name's last path component, not its first character -- or -1 where the name has no key; *start
   is where the key begins, after any leading "./" ('tar -C dir .'). */
static Py_ssize_t key_dot(const unsigned char *np, Py_ssize_t nlen, Py_ssize_t *start)
{
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
    if (dot <= slash + 1)
        return -1;
    Py_ssize_t k = 0;
    while (k + 1 < dot && np[k] == '.' && np[k + 1] == '/')
        k += 2;
    *start = k;
    return dot;
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
    Py_ssize_t n = view.len;
    /* every offset handed out is base + a position in buf (+ 512 for a ref's data): within 64 bits */
    if (pos < 0 || pos > n)
        PyErr_Format(PyExc_ValueError, "scan: pos %zd is outside the buffer of %zd bytes", pos, n);
    else if (base < 0 || max_size < 0 || views < 0 || refs < 0)
        PyErr_SetString(PyExc_ValueError, "scan: base, max_member_size, views and refs must be >= 0");
    else if (base > LLONG_MAX - 512 - (long long)n)
        PyErr_Format(PyExc_OverflowError, "scan: base %lld + the buffer's %zd bytes pass a 64-bit offset", base, n);
    else if (ref != Py_None && !PyCallable_Check(ref))
        PyErr_Format(PyExc_TypeError, "scan: ref must be callable or None, not %.100s", Py_TYPE(ref)->tp_name);
    if (PyErr_Occurred()) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (ref == Py_None)
        refs = 0;
    const unsigned char *buf = (const unsigned char *)view.buf;
    long long nbytes = 0;
    Py_ssize_t last_header = -1; /* where in buf the last item's header is */
    unsigned char name[256 + 2];
    PyObject *whole = NULL; /* a memoryview of all of buf, sliced for each member given as a view */
    if (views > 0 && !PyBytes_CheckExact(view.obj))
        views = 0; /* only an immutable buffer can be shared */
    PyObject *items = PyList_New(0);
    if (items == NULL)
        goto fail;

    while (n - pos >= 512) {
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
        if (padded > n - pos - 512) {
            if (refs <= 0 || size < refs)
                break;
            as_ref = 1;
        }

        if (h[0] == 0)
            break; /* no name */
        Py_ssize_t nlen;
        const unsigned char *np = member_name(h, name, &nlen);
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
            Py_ssize_t start = 0, dot = key_dot(np, nlen, &start);
            PyObject *key, *field;
            if (dot < 0) {
                key = Py_None;
                Py_INCREF(key);
                field = decode(np, nlen);
            } else {
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
        last_header = pos;
        pos += 512 + padded;
        if (as_ref)
            break; /* pos is past the end of buf: the caller moves the stream past that data */
    }
    /* the last member's name (the reader names it in errors that follow) */
    PyObject *last = Py_None;
    Py_INCREF(last);
    if (last_header >= 0) {
        Py_ssize_t nlen;
        const unsigned char *np = member_name(buf + last_header, name, &nlen);
        Py_SETREF(last, decode(np, nlen));
        if (last == NULL)
            goto fail;
    }
    Py_XDECREF(whole);
    PyBuffer_Release(&view);
    return Py_BuildValue("NnLN", items, pos, nbytes, last);

fail:
    Py_XDECREF(whole);
    Py_XDECREF(items);
    PyBuffer_Release(&view);
    return NULL;
}

/*
 * index_file(fd, origin, max_member_size, entry_type) -> (entries, size, members, nbytes, directories) or None
 *
 * tarproc.index's builder for the plain shard it meets most: a regular file read with pread from
 * file offset `origin`, seeking past member data (only headers are read). It handles ustar/GNU/v7
 * headers of regular files (with the rules of scan above) and directories, GNU long names, and pax
 * headers that give a path or nothing the reader takes (times, owners); every member has a key,
 * no name is metadata, no field repeats in a sample, no key reappears, and the archive ends with a
 * zero block followed by zeros only, up to the end of the file. Anything else -- another type, a
 * checksum scan would not take, a size over the limit, a name without a key, a file that ends
 * early, a read that fails -- returns None, having created nothing the caller sees: the Python
 * builder (the reference) then indexes the file and raises any error. Entries are
 * entry_type(key, offset, size, fields, names) as tarproc.index._entry makes them; size is the
 * stream's length; members and nbytes are the regular members and their data bytes, directories
 * the directory entries skipped.
 */
#define INDEX_CHUNK (256 * 1024) /* read at a time where members are small */
#define INDEX_HEAD 4096          /* read after the first data that was skipped */
#define INDEX_SKIP (64 * 1024)   /* data this big is skipped, not read, when it runs past what is held */
#define INDEX_LONG_NAME 4096     /* the longest long name or pax path indexed here (PATH_MAX, without its NUL) */

typedef struct {
    int fd;
    long long origin;
    unsigned char *buf;
    long long start; /* stream offset of buf[0] */
    Py_ssize_t len;  /* bytes held */
} Window;

/* Hold [pos, pos + need) (need at most INDEX_CHUNK), reading chunk bytes or need, whichever is
   more, where it isn't held; 1, or 0 where the file ends first, -1 where reading fails. */
static int window_at(Window *w, long long pos, Py_ssize_t need, Py_ssize_t chunk)
{
    if (chunk < need)
        chunk = need;
    if (pos > LLONG_MAX - w->origin - chunk)
        return 0; /* past any file's end (and origin + pos + chunk would overflow) */
    if (pos >= w->start && pos + need <= w->start + w->len)
        return 1;
    Py_ssize_t got = 0;
    while (got < chunk) {
        ssize_t r;
        Py_BEGIN_ALLOW_THREADS
        r = pread(w->fd, w->buf + got, (size_t)(chunk - got), (off_t)(w->origin + pos + got));
        Py_END_ALLOW_THREADS
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0)
            break;
        got += r;
    }
    w->start = pos;
    w->len = got;
    return got >= need;
}

static const unsigned char zero_block[512];

/* After the first zero block at pos: zeros up to the end of the file? The stream's length, or -1. */
static long long zeros_to_end(Window *w, long long pos)
{
    for (;;) {
        const unsigned char *p = w->buf + (pos - w->start), *end = w->buf + w->len;
        for (; p < end; p++)
            if (*p)
                return -1;
        pos = w->start + w->len;
        int held = window_at(w, pos, 1, INDEX_CHUNK);
        if (held <= 0)
            return held < 0 ? -1 : pos; /* a read that failed, or the end of the file */
    }
}

/* The sample being built: its key's bytes, and the objects an entry is made of. */
typedef struct {
    unsigned char key[INDEX_LONG_NAME];
    Py_ssize_t klen;
    PyObject *key_obj, *fields, *names;
    long long offset, end;
} IndexSample;

static void sample_clear(IndexSample *s)
{
    Py_CLEAR(s->key_obj);
    Py_CLEAR(s->fields);
    Py_CLEAR(s->names);
}

/* An entry_type (a tuple subclass without instance fields: IndexEntry) of five items. It is left
   untracked by the collector until the walk ends (index_file tracks them all then), so that the
   collections that making a hundred thousand of them sets off don't walk them again and again
   (they took half the time on a shard of small samples); its dicts, of strings and pairs of
   ints, stay untracked as CPython leaves such dicts, until something else is put in one. */
static int sample_finish(IndexSample *s, PyObject *entries, PyTypeObject *entry_type)
{
    PyObject *offset = PyLong_FromLongLong(s->offset), *size = PyLong_FromLongLong(s->end - s->offset);
    PyObject *entry = offset && size ? entry_type->tp_alloc(entry_type, 5) : NULL;
    if (entry == NULL) {
        Py_XDECREF(offset);
        Py_XDECREF(size);
        sample_clear(s);
        return -1;
    }
    PyObject_GC_UnTrack(entry);
    PyTuple_SET_ITEM(entry, 0, s->key_obj);
    PyTuple_SET_ITEM(entry, 1, offset);
    PyTuple_SET_ITEM(entry, 2, size);
    PyTuple_SET_ITEM(entry, 3, s->fields);
    PyTuple_SET_ITEM(entry, 4, s->names ? s->names : Py_NewRef(Py_None));
    s->key_obj = s->fields = s->names = NULL; /* the entry has them now */
    int r = PyList_Append(entries, entry);
    Py_DECREF(entry);
    return r;
}

/* Add a member's field (its data offset and size); 0, 1 where the sample has that field already
   (the caller gives up), -1 on error. `name` is the member's whole name, kept where it isn't
   KEY.FIELD: a "./" dropped from the key, an extension in upper case. */
static int sample_add(IndexSample *s, const unsigned char *np, Py_ssize_t nlen, Py_ssize_t kstart, Py_ssize_t dot,
                      long long data_offset, long long size)
{
    const unsigned char *fp = np + dot + 1;
    Py_ssize_t flen = nlen - dot - 1;
    PyObject *field = decode_lower(fp, flen);
    if (field == NULL)
        return -1;
    int has = PyDict_Contains(s->fields, field);
    if (has != 0) {
        Py_DECREF(field);
        return has;
    }
    PyObject *place = Py_BuildValue("(LL)", data_offset, size);
    if (place != NULL)
        PyObject_GC_UnTrack(place); /* two ints: no cycle; the dict that holds it stays untracked too */
    if (place == NULL || PyDict_SetItem(s->fields, field, place) < 0) {
        Py_XDECREF(place);
        Py_DECREF(field);
        return -1;
    }
    Py_DECREF(place);
    int same = kstart == 0;
    for (Py_ssize_t i = 0; same && i < flen; i++)
        if ((fp[i] >= 'A' && fp[i] <= 'Z') || fp[i] >= 0x80)
            same = 0;
    if (!same) { /* compare as str, as _entry does */
        PyObject *name = decode(np, nlen);
        PyObject *plain = name ? PyUnicode_FromFormat("%U.%U", s->key_obj, field) : NULL;
        int differs = plain ? PyUnicode_Compare(name, plain) != 0 : -1;
        Py_XDECREF(plain);
        if (differs > 0 && PyErr_Occurred())
            differs = -1;
        if (differs == 1) {
            if (s->names == NULL && (s->names = PyDict_New()) == NULL)
                differs = -1;
            else if (PyDict_SetItem(s->names, field, name) < 0)
                differs = -1;
        }
        Py_XDECREF(name);
        if (differs < 0) {
            Py_DECREF(field);
            return -1;
        }
    }
    Py_DECREF(field);
    return 0;
}

/* Pax records (tar/headers.py parse_pax's syntax, read strictly: a decimal length, a space, KEY=VALUE, a
   newline; NUL padding after the last) that the index can take: 1 where none of them sets a key
   the reader takes but path (linkpath, size, GNU.sparse.*), with *path the value of the last path
   record (NULL: none) and *path_len its length; 0 for anything else (the reference reads it). */
static int pax_records(const unsigned char *p, Py_ssize_t n, const unsigned char **path, Py_ssize_t *path_len)
{
    Py_ssize_t at = 0;
    *path = NULL;
    while (at < n && p[at] != 0) {
        Py_ssize_t i = at, length = 0;
        while (i < n && p[i] >= '0' && p[i] <= '9' && length < n)
            length = length * 10 + (p[i++] - '0');
        if (i == at || i >= n || p[i] != ' ' || length <= i - at + 1 || at + length > n || p[at + length - 1] != '\n')
            return 0;
        const unsigned char *kv = p + i + 1, *end = p + at + length - 1, *eq = memchr(kv, '=', (size_t)(end - kv));
        if (eq == NULL || eq == kv)
            return 0;
        Py_ssize_t klen = eq - kv;
        if (klen == 4 && memcmp(kv, "path", 4) == 0) {
            *path = eq + 1;
            *path_len = end - (eq + 1);
        } else if ((klen == 8 && memcmp(kv, "linkpath", 8) == 0) || (klen == 4 && memcmp(kv, "size", 4) == 0) ||
                   (klen >= 11 && memcmp(kv, "GNU.sparse.", 11) == 0)) {
            return 0;
        }
        at += length;
    }
    return 1;
}

static PyObject *index_file(PyObject *self, PyObject *args)
{
    int fd;
    long long origin, max_size;
    PyTypeObject *entry_type;
    if (!PyArg_ParseTuple(args, "iLLO!", &fd, &origin, &max_size, &PyType_Type, &entry_type))
        return NULL;
    if (fd < 0 || origin < 0 || max_size < 0) {
        PyErr_Format(PyExc_ValueError, "index_file: fd, origin and max_member_size must be >= 0, not %d, %lld, %lld",
                     fd, origin, max_size);
        return NULL;
    }
    if (!PyType_IsSubtype(entry_type, &PyTuple_Type) || entry_type->tp_basicsize != PyTuple_Type.tp_basicsize ||
        entry_type->tp_itemsize != PyTuple_Type.tp_itemsize) {
        PyErr_SetString(PyExc_TypeError, "index_file: entry_type must be a tuple subclass without fields of its own");
        return NULL;
    }
    Window w = {fd, origin, NULL, 0, 0};
    IndexSample s;
    memset(&s, 0, sizeof(s));
    PyObject *entries = PyList_New(0), *seen = PySet_New(NULL), *result = NULL;
    w.buf = PyMem_Malloc(INDEX_CHUNK);
    if (entries == NULL || seen == NULL || w.buf == NULL) {
        if (w.buf == NULL)
            PyErr_NoMemory();
        goto done;
    }
    long long pos = 0, prev_end = 0, members = 0, nbytes = 0, dirs = 0, length = -1;
    /* after data that was skipped, read what the last sample needed there (its small members up
       to the big one's header): copying less than a page of 4 KiB per sample is a fifth faster on a
       shard of big images, and a sample that needs more costs one read more */
    long long landed = -1; /* where the read after the last skip began */
    Py_ssize_t chunk = INDEX_CHUNK, head = INDEX_HEAD;
    unsigned char name[256 + 2];
    /* extension headers for the next member: a GNU long name (long_len >= 0), pax records (pax),
       with a path (path_len >= 0), which a long name comes before, as in the reader */
    unsigned char long_name[INDEX_LONG_NAME], pax_path[INDEX_LONG_NAME];
    Py_ssize_t long_len = -1, path_len = -1;
    int pax = 0;

    for (;;) {
        int held = window_at(&w, pos, 512, chunk);
        if (held <= 0)
            goto give_up;
        const unsigned char *h = w.buf + (pos - w.start);
        if (memcmp(h, zero_block, 512) == 0) {
            if (long_len >= 0 || pax || (length = zeros_to_end(&w, pos)) < 0)
                goto give_up;
            break;
        }
        unsigned char tf = h[156];
        if (tf != '0' && tf != 0 && tf != '7' && tf != '5' && tf != 'L' && tf != 'x')
            goto give_up;
        long long stored = parse_octal(h + 148, 8), sum = 8 * ' ';
        for (int i = 0; i < 148; i++)
            sum += h[i];
        for (int i = 156; i < 512; i++)
            sum += h[i];
        if (stored < 0 || sum != stored || (h[124] & 0x80))
            goto give_up;
        long long size = parse_octal(h + 124, 12);
        if (size < 0 || size > max_size || size > LLONG_MAX - 2048 - pos)
            goto give_up; /* the last: offsets past 63 bits, in a file no filesystem holds */
        if (tf == 'L' || tf == 'x') { /* an extension header: its data is small, read it here */
            long long padded = (size + 511) & ~511LL;
            if (512 + padded > INDEX_CHUNK || (tf == 'L' && (long_len >= 0 || size > INDEX_LONG_NAME + 1)))
                goto give_up;
            if (window_at(&w, pos, 512 + (Py_ssize_t)padded, INDEX_CHUNK) <= 0)
                goto give_up;
            const unsigned char *data = w.buf + (pos - w.start) + 512;
            if (tf == 'L') { /* the name, up to its first NUL */
                long_len = (Py_ssize_t)strnlen((const char *)data, (size_t)size);
                if (long_len > INDEX_LONG_NAME)
                    goto give_up;
                memcpy(long_name, data, (size_t)long_len);
            } else { /* a second pax header replaces the first, as in the reader */
                const unsigned char *path;
                Py_ssize_t len = 0;
                if (!pax_records(data, (Py_ssize_t)size, &path, &len) || len > INDEX_LONG_NAME)
                    goto give_up;
                pax = 1;
                path_len = path == NULL ? -1 : len;
                if (path != NULL)
                    memcpy(pax_path, path, (size_t)len);
            }
            pos += 512 + padded;
            chunk = INDEX_CHUNK;
            continue;
        }
        if (tf == '5') { /* a directory: no data, whatever its size field says */
            dirs++;
            pos += 512;
            chunk = INDEX_CHUNK;
            long_len = path_len = -1;
            pax = 0;
            continue;
        }

        Py_ssize_t nlen, kstart = 0;
        const unsigned char *np;
        if (long_len >= 0) {
            np = long_name;
            nlen = long_len;
        } else if (path_len >= 0) {
            np = pax_path;
            nlen = path_len;
        } else {
            if (h[0] == 0)
                goto give_up; /* no name */
            np = member_name(h, name, &nlen);
        }
        long_len = path_len = -1;
        pax = 0;
        if (nlen == 0 || np[nlen - 1] == '/')
            goto give_up;
        Py_ssize_t dot = key_dot(np, nlen, &kstart);
        if (dot < 0)
            goto give_up; /* no key */
        const unsigned char *kp = np + kstart;
        Py_ssize_t klen = dot - kstart;
        if (klen > (Py_ssize_t)sizeof(s.key))
            goto give_up;
        if (kp[0] == '_' || (nlen - dot - 1 >= 2 && np[dot + 1] == '_' && np[dot + 2] == '_'))
            goto give_up; /* maybe metadata */

        long long padded = (size + 511) & ~511LL, data_offset = pos + 512;
        if (s.key_obj == NULL || klen != s.klen || memcmp(kp, s.key, (size_t)klen) != 0) {
            PyObject *key = decode(kp, klen);
            if (key == NULL)
                goto done;
            if (s.key_obj != NULL && sample_finish(&s, entries, entry_type) < 0) {
                Py_DECREF(key);
                goto done;
            }
            int again = PySet_Contains(seen, key);
            if (again != 0 || PySet_Add(seen, key) < 0) {
                Py_DECREF(key);
                if (again > 0)
                    goto give_up; /* a key that reappears */
                goto done;
            }
            s.key_obj = key;
            memcpy(s.key, kp, (size_t)klen);
            s.klen = klen;
            s.offset = prev_end;
            if ((s.fields = PyDict_New()) == NULL)
                goto done;
        }
        int dup = sample_add(&s, np, nlen, kstart, dot, data_offset, size);
        if (dup < 0)
            goto done;
        if (dup > 0)
            goto give_up; /* a field the sample has already */
        s.end = prev_end = data_offset + padded;
        members++;
        nbytes += size;
        chunk = INDEX_CHUNK;
        if (padded >= INDEX_SKIP && data_offset + padded + 512 > w.start + w.len) { /* skip the data */
            if (landed >= 0 && data_offset - landed <= INDEX_CHUNK)
                head = data_offset - landed < 1024 ? 1024 : (Py_ssize_t)(data_offset - landed);
            chunk = head;
            landed = data_offset + padded;
        }
        pos = data_offset + padded;
    }
    if (s.key_obj != NULL && sample_finish(&s, entries, entry_type) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries); i++) /* a user may yet put a cycle through one */
        PyObject_GC_Track(PyList_GET_ITEM(entries, i));
    result = Py_BuildValue("OLLLL", entries, length, members, nbytes, dirs);
    goto done;

give_up:
    result = Py_None;
    Py_INCREF(result);
done:
    sample_clear(&s);
    PyMem_Free(w.buf);
    Py_XDECREF(entries);
    Py_XDECREF(seen);
    return result;
}

/*
 * jsonl_lines(entries, encode) -> bytes or None
 *
 * The per-sample lines of tarproc.index.ShardIndex.jsonl_text, each ending in a newline, byte for
 * byte what its Python code writes; encode is json's encode_basestring_ascii, called for the strings
 * that aren't plain printable ASCII. None (the Python code then writes them) where an entry isn't
 * what the builders make: a key that isn't a str, a number that isn't an int of 64 bits, a field
 * that isn't an (offset, size) pair.
 */
typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Text;

static int text_reserve(Text *t, Py_ssize_t n)
{
    if (t->len + n <= t->cap)
        return 0;
    Py_ssize_t cap = t->cap ? t->cap : 1 << 16;
    while (cap < t->len + n)
        cap *= 2;
    char *p = PyMem_Realloc(t->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->p = p;
    t->cap = cap;
    return 0;
}

static int text_put(Text *t, const char *s, Py_ssize_t n)
{
    if (text_reserve(t, n) < 0)
        return -1;
    memcpy(t->p + t->len, s, (size_t)n);
    t->len += n;
    return 0;
}

/* A JSON string as json.dumps writes it (ensure_ascii); 1 where s is not a str. */
static int text_json_str(Text *t, PyObject *s, PyObject *encode)
{
    if (!PyUnicode_CheckExact(s))
        return 1;
    if (PyUnicode_IS_ASCII(s)) {
        const char *a = (const char *)PyUnicode_1BYTE_DATA(s);
        Py_ssize_t n = PyUnicode_GET_LENGTH(s), i = 0;
        while (i < n && a[i] >= ' ' && a[i] <= '~' && a[i] != '"' && a[i] != '\\')
            i++;
        if (i == n) {
            if (text_reserve(t, n + 2) < 0)
                return -1;
            t->p[t->len++] = '"';
            memcpy(t->p + t->len, a, (size_t)n);
            t->len += n;
            t->p[t->len++] = '"';
            return 0;
        }
    }
    PyObject *q = PyObject_CallOneArg(encode, s);
    if (q == NULL)
        return -1;
    int r = PyUnicode_Check(q) && PyUnicode_IS_ASCII(q)
                ? text_put(t, (const char *)PyUnicode_1BYTE_DATA(q), PyUnicode_GET_LENGTH(q))
                : 1;
    Py_DECREF(q);
    return r;
}

/* An int as str() writes it; 1 where v is not an int of 64 bits. */
static int text_int(Text *t, PyObject *v)
{
    if (!PyLong_CheckExact(v))
        return 1;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow)
        return 1;
    if (x == -1 && PyErr_Occurred())
        return -1;
    char digits[24], *end = digits + sizeof(digits), *d = end;
    unsigned long long u = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
    do {
        *--d = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (x < 0)
        *--d = '-';
    return text_put(t, d, end - d);
}

#define TEXT_TRY(call)          \
    do {                        \
        int r_ = (call);        \
        if (r_ != 0) {          \
            status = r_;        \
            goto stop;          \
        }                       \
    } while (0)
#define TEXT_LIT(t, s) text_put((t), (s), (Py_ssize_t)(sizeof(s) - 1))

static PyObject *jsonl_lines(PyObject *self, PyObject *args)
{
    PyObject *entries, *encode;
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &entries, &encode))
        return NULL;
    if (!PyCallable_Check(encode)) {
        PyErr_Format(PyExc_TypeError, "jsonl_lines: encode must be callable, not %.100s", Py_TYPE(encode)->tp_name);
        return NULL;
    }
    Text t = {NULL, 0, 0};
    int status = 0; /* -1: an error; 1: an entry the Python code must write */
    /* encode is Python code: it may change entries, or the dicts being written. What is being
       written is held (e, field, place, name) so that nothing is freed under it. */
    PyObject *e = NULL, *field = NULL, *place = NULL, *name = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries); i++) {
        Py_XSETREF(e, Py_NewRef(PyList_GET_ITEM(entries, i)));
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 5) {
            status = 1;
            goto stop;
        }
        PyObject *fields = PyTuple_GET_ITEM(e, 3), *names = PyTuple_GET_ITEM(e, 4);
        if (!PyDict_CheckExact(fields) || (names != Py_None && !PyDict_CheckExact(names))) {
            status = 1;
            goto stop;
        }
        TEXT_TRY(TEXT_LIT(&t, "{\"key\":"));
        TEXT_TRY(text_json_str(&t, PyTuple_GET_ITEM(e, 0), encode));
        TEXT_TRY(TEXT_LIT(&t, ",\"offset\":"));
        TEXT_TRY(text_int(&t, PyTuple_GET_ITEM(e, 1)));
        TEXT_TRY(TEXT_LIT(&t, ",\"size\":"));
        TEXT_TRY(text_int(&t, PyTuple_GET_ITEM(e, 2)));
        TEXT_TRY(TEXT_LIT(&t, ",\"fields\":{"));
        Py_ssize_t at = 0;
        PyObject *f, *p;
        for (int first = 1; PyDict_Next(fields, &at, &f, &p); first = 0) {
            Py_XSETREF(field, Py_NewRef(f));
            Py_XSETREF(place, Py_NewRef(p));
            if (!PyTuple_CheckExact(place) || PyTuple_GET_SIZE(place) != 2) {
                status = 1;
                goto stop;
            }
            if (!first)
                TEXT_TRY(TEXT_LIT(&t, ","));
            TEXT_TRY(text_json_str(&t, field, encode));
            TEXT_TRY(TEXT_LIT(&t, ":["));
            TEXT_TRY(text_int(&t, PyTuple_GET_ITEM(place, 0)));
            TEXT_TRY(TEXT_LIT(&t, ","));
            TEXT_TRY(text_int(&t, PyTuple_GET_ITEM(place, 1)));
            TEXT_TRY(TEXT_LIT(&t, "]"));
        }
        TEXT_TRY(TEXT_LIT(&t, "}"));
        if (names != Py_None && PyDict_GET_SIZE(names) > 0) {
            TEXT_TRY(TEXT_LIT(&t, ",\"names\":{"));
            at = 0;
            for (int first = 1; PyDict_Next(names, &at, &f, &p); first = 0) {
                Py_XSETREF(field, Py_NewRef(f));
                Py_XSETREF(name, Py_NewRef(p));
                if (!first)
                    TEXT_TRY(TEXT_LIT(&t, ","));
                TEXT_TRY(text_json_str(&t, field, encode));
                TEXT_TRY(TEXT_LIT(&t, ":"));
                TEXT_TRY(text_json_str(&t, name, encode));
            }
            TEXT_TRY(TEXT_LIT(&t, "}"));
        }
        TEXT_TRY(TEXT_LIT(&t, "}\n"));
    }
stop:;
    Py_XDECREF(e);
    Py_XDECREF(field);
    Py_XDECREF(place);
    Py_XDECREF(name);
    PyObject *result = NULL;
    if (status == 0)
        result = PyBytes_FromStringAndSize(t.p ? t.p : "", t.len);
    else if (status > 0) {
        result = Py_None;
        Py_INCREF(result);
    }
    PyMem_Free(t.p);
    return result;
}

/* "__key__", "__url__" and "samples", made once (PyInit__speedups) */
static PyObject *str_key, *str_url, *str_samples;

/* tar.FileRange, once tar/writer.py has registered it (set_range_type): member data left in a file. */
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
 * The writer: tarproc.tar.TarWriter (tar/writer.py) is the reference; this does the same for the common case.
 *
 * pack(buf, used, members, start, templates, direct) -> (used, next, status)
 *
 * Writes members[start:] -- (name: str, data: bytes | bytearray | memoryview) tuples -- into the
 * writable buffer `buf` from offset `used` on: header(s), data, zero padding to 512 bytes. The
 * headers are TarWriter's: a ustar header where the UTF-8 name fits 100 bytes or splits at a slash
 * into a 155-byte prefix and a 100-byte name (the same split as tar/writer.py's _split_ustar), else a GNU
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
 *               tar.FileRange, see set_range_type): its header(s) are in buf, and the
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

/* TarWriter's three header templates (ustar, GNU, GNU "L"), with the unsigned sum of each but its
 * size field, summed once per call of pack or pack_samples and only if used. */
typedef struct {
    const unsigned char *p;
    long sum[3];
} Templates;

static void templates_init(Templates *t, const unsigned char *p)
{
    t->p = p;
    t->sum[0] = t->sum[1] = t->sum[2] = -1;
}

static unsigned int bytes_sum(const unsigned char *p, Py_ssize_t n)
{
    unsigned int sum = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        sum += p[i];
    return sum;
}

/* One header at h: template `kind`, then name, prefix, size and the checksum, the unsigned sum of
 * the 512 bytes (with the checksum field as the template's 8 spaces): the template's sum without
 * its size field, plus name, prefix and size (the template's name and prefix fields are empty). */
static void put_header(unsigned char *h, Templates *t, int kind, const char *name, Py_ssize_t nlen,
                       const char *prefix, Py_ssize_t plen, unsigned long long size)
{
    const unsigned char *tmpl = t->p + 512 * kind;
    if (t->sum[kind] < 0)
        t->sum[kind] = (long)(bytes_sum(tmpl, 124) + bytes_sum(tmpl + 136, 512 - 136));
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
    unsigned int sum = (unsigned int)t->sum[kind] + bytes_sum((const unsigned char *)name, nlen) +
                       bytes_sum((const unsigned char *)prefix, plen) + bytes_sum(h + 124, 12);
    for (int i = 5; i >= 0; i--) { /* "%06o\0 " */
        h[148 + i] = (unsigned char)('0' + (sum & 7));
        sum >>= 3;
    }
    h[154] = 0;
    h[155] = ' ';
}

/* Bytes a member's header(s) take: one header, or a GNU long-name record and a header. */
static Py_ssize_t header_size(const char *raw, Py_ssize_t nlen)
{
    return nlen > 100 && split_ustar(raw, nlen) < 0 ? 512 + PADDED(nlen + 1) + 512 : 512;
}

/* A member's header(s) into buf at used, then its data and padding unless data is NULL (big data,
 * written by the caller); returns the new used, or -1 (nothing written) when that does not fit
 * in cap. templates: TarWriter's three header kinds (see above). */
enum { USTAR = 0, GNU = 1, LONGLINK = 2 };

static Py_ssize_t put_member(unsigned char *buf, Py_ssize_t cap, Py_ssize_t used, Templates *t,
                             const char *raw, Py_ssize_t nlen, const void *data, Py_ssize_t size)
{
    Py_ssize_t split = nlen > 100 ? split_ustar(raw, nlen) : -1;
    int long_name = nlen > 100 && split < 0;
    Py_ssize_t head = long_name ? 512 + PADDED(nlen + 1) + 512 : 512;
    if (head + (data == NULL ? 0 : PADDED(size)) > cap - used)
        return -1;
    unsigned char *h = buf + used;
    if (long_name) {
        Py_ssize_t record = PADDED(nlen + 1);
        put_header(h, t, LONGLINK, "", 0, "", 0, (unsigned long long)(nlen + 1));
        memcpy(h + 512, raw, (size_t)nlen);
        memset(h + 512 + nlen, 0, (size_t)(record - nlen));
        put_header(h + 512 + record, t, GNU, raw, 100, "", 0, (unsigned long long)size);
    } else if (split >= 0) {
        put_header(h, t, USTAR, raw + split + 1, nlen - split - 1, raw, split, (unsigned long long)size);
    } else {
        put_header(h, t, USTAR, raw, nlen, "", 0, (unsigned long long)size);
    }
    used += head;
    if (data != NULL) {
        memcpy(buf + used, data, (size_t)size);
        memset(buf + used + size, 0, (size_t)(PADDED(size) - size));
        used += PADDED(size);
    }
    return used;
}

static PyObject *pack(PyObject *self, PyObject *args)
{
    Py_buffer out, tm;
    Py_ssize_t used, start, direct;
    PyObject *members;
    if (!PyArg_ParseTuple(args, "w*nOny*n", &out, &used, &members, &start, &tm, &direct))
        return NULL;
    PyObject *seq = NULL, *item = NULL;
    if (tm.len != 3 * 512) {
        PyErr_Format(PyExc_ValueError, "pack: templates must be 3 headers of 512 bytes, not %zd bytes", tm.len);
        goto fail;
    }
    if (used < 0 || used > out.len || direct < 0) {
        PyErr_Format(PyExc_ValueError, "pack: need 0 <= used <= len(buf) (%zd) and direct >= 0, not used %zd, "
                     "direct %zd", out.len, used, direct);
        goto fail;
    }
    Templates templates;
    templates_init(&templates, tm.buf);
    if (!PyList_Check(members) && !PyTuple_Check(members)) {
        PyErr_Format(PyExc_TypeError, "pack: members must be a list or a tuple, not %.100s", Py_TYPE(members)->tp_name);
        goto fail;
    }
    seq = Py_NewRef(members);
    if (start < 0 || start > PySequence_Fast_GET_SIZE(seq)) {
        PyErr_Format(PyExc_ValueError, "pack: start %zd is outside members (%zd of them)", start,
                     PySequence_Fast_GET_SIZE(seq));
        goto fail;
    }
    unsigned char *buf = out.buf;
    Py_ssize_t cap = out.len;
    int status = PACK_DONE;
    Py_ssize_t i;

    /* a FileRange's __len__ is Python code, which may change a list of members: its length is read
       again for each member, and the member being written is held */
    for (i = start; i < PySequence_Fast_GET_SIZE(seq); i++) {
        Py_XSETREF(item, Py_NewRef(PySequence_Fast_GET_ITEM(seq, i)));
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            status = PACK_PYTHON;
            break;
        }
        PyObject *name = PyTuple_GET_ITEM(item, 0), *data = PyTuple_GET_ITEM(item, 1);
        /* data left in a file (tar.FileRange) is written by the caller, as big data is */
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
            if ((size = PyObject_Size(data)) < 0) { /* the Python writer raises it, after what is packed */
                PyErr_Clear();
                status = PACK_PYTHON;
                break;
            }
        } else {
            if (PyObject_GetBuffer(data, &dv, PyBUF_SIMPLE) < 0) { /* not contiguous, or released */
                PyErr_Clear();
                status = PACK_PYTHON;
                break;
            }
            size = dv.len;
        }
        int big = is_range || size >= direct;
        Py_ssize_t next = put_member(buf, cap, used, &templates, raw, nlen, big ? NULL : dv.buf, size);
        if (!is_range)
            PyBuffer_Release(&dv);
        if (next < 0) {
            status = used == 0 ? PACK_PYTHON : PACK_FULL;
            break;
        }
        used = next;
        if (big) {
            status = PACK_BIG;
            break;
        }
    }
    Py_XDECREF(item);
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
 * members(sample) -> (key, [(name, value), ...]) or None: tar.sample_members for the common
 * case, where that gives the same without raising: a dict whose "__key__" is a str that passes
 * tar.check_key, whose fields are str of ASCII without upper case, '/' or NUL (so no two can
 * differ only in case), at least one of them not starting with "__" (those are skipped), and
 * whose values are bytes (or what encode_value passes on as it is: a memoryview of single bytes, a
 * tar.FileRange). Members are "KEY.FIELD" in sorted field order. None for anything else:
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
    Py_buffer *b = PyMemoryView_GET_BUFFER(value), probe;
    if (b->itemsize != 1 || b->ndim != 1 || !PyBuffer_IsContiguous(b, 'C'))
        return 0;
    if (PyObject_GetBuffer(value, &probe, PyBUF_SIMPLE) < 0) { /* released: encode_value raises */
        PyErr_Clear();
        return 0;
    }
    PyBuffer_Release(&probe);
    return 1;
}

/* The fields of a sample in members' common case, sorted, with its key as UTF-8 (k, klen);
 * Py_None (a new reference) when it is not that case, NULL on an error. */
static PyObject *common_fields(PyObject *sample, PyObject **key, const char **k, Py_ssize_t *klen)
{
    if (!PyDict_CheckExact(sample))
        Py_RETURN_NONE;
    *key = PyDict_GetItemWithError(sample, str_key); /* borrowed */
    if (*key == NULL && PyErr_Occurred())
        return NULL;
    if (*key == NULL || !PyUnicode_CheckExact(*key))
        Py_RETURN_NONE;
    if ((*k = PyUnicode_AsUTF8AndSize(*key, klen)) == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (!key_ok(*k, *klen))
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
    if (PyList_Sort(fields) < 0) {
        Py_DECREF(fields);
        return NULL;
    }
    return fields;
}

static int is_metadata_field(PyObject *field)
{
    const char *f = (const char *)PyUnicode_1BYTE_DATA(field);
    return PyUnicode_GET_LENGTH(field) >= 2 && f[0] == '_' && f[1] == '_';
}

/* The next field of `fields` from *i on that is written (not a "__field__"), in *field, and the
 * sample's value for it (borrowed), in *value: 1; 0 when there is none left; -1 on an error (a
 * field from the dict's own keys is always there). */
static int next_field(PyObject *sample, PyObject *fields, Py_ssize_t *i, PyObject **field, PyObject **value)
{
    while (*i < PyList_GET_SIZE(fields)) {
        *field = PyList_GET_ITEM(fields, (*i)++);
        if (is_metadata_field(*field))
            continue;
        *value = PyDict_GetItemWithError(sample, *field);
        if (*value == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, *field);
            return -1;
        }
        return 1;
    }
    return 0;
}

static PyObject *members(PyObject *self, PyObject *sample)
{
    PyObject *key = NULL;
    const char *k;
    Py_ssize_t klen;
    PyObject *fields = common_fields(sample, &key, &k, &klen);
    if (fields == NULL || fields == Py_None)
        return fields;
    PyObject *out = NULL, *field, *value;
    PyObject *prefix = PyUnicode_FromFormat("%U.", key);
    out = PyList_New(0);
    if (prefix == NULL || out == NULL)
        goto fail;
    Py_ssize_t i = 0;
    int got;
    while ((got = next_field(sample, fields, &i, &field, &value)) > 0) {
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
    if (got < 0)
        goto fail;
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
    Py_XDECREF(prefix);
    Py_DECREF(fields);
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * pack_one: TarWriter.write_sample for the common case -- members(sample) and pack of what it
 * gives, where every value is bytes (or a memoryview of single bytes) under `direct` bytes and
 * the key is not last_key. All of the sample's members go into buf, or none:
 *   PACK_DONE   written (*written: how many members; *key: the sample's key, borrowed);
 *   PACK_FULL   they do not fit in what is left of buf: write buf[:used] out, then write it;
 *   PACK_PYTHON not the common case, or too big for an empty buf: nothing written, the Python
 *               writer does it (or raises the error);
 * -1 on an error.
 */
#define NAME_MAX_BYTES 4096

static int pack_one(unsigned char *buf, Py_ssize_t cap, Py_ssize_t *used, PyObject *sample, Templates *tm,
                    Py_ssize_t direct, PyObject *last_key, Py_ssize_t *written, PyObject **key)
{
    const char *k;
    Py_ssize_t klen, count = 0;
    int status = PACK_PYTHON;
    *written = 0;
    PyObject *fields = common_fields(sample, key, &k, &klen);
    if (fields == NULL)
        return -1;
    if (fields == Py_None || klen + 1 + 256 > NAME_MAX_BYTES)
        goto done;
    /* the key is borrowed from the sample: nothing that runs Python code (a str subclass's __eq__)
     * may happen while it is used, so a last key that is not a plain str is the Python writer's */
    if (last_key != Py_None && !PyUnicode_CheckExact(last_key))
        goto done;
    if (last_key != Py_None && PyUnicode_Compare(*key, last_key) == 0)
        goto done; /* the same key twice in a row: the Python writer raises the error */
    char name[NAME_MAX_BYTES];
    memcpy(name, k, (size_t)klen);
    name[klen] = '.';
    Py_ssize_t need = 0, at = *used;
    for (int pass = 0; pass < 2; pass++) { /* 0: check and measure; 1: write */
        Py_ssize_t i = 0;
        int got;
        PyObject *field, *value;
        while ((got = next_field(sample, fields, &i, &field, &value)) > 0) {
            Py_buffer dv;
            if (!(PyBytes_CheckExact(value) || byte_view(value)))
                goto done; /* encode_value's work, or data left in a file */
            if (PyObject_GetBuffer(value, &dv, PyBUF_SIMPLE) < 0) { /* a released view */
                PyErr_Clear();
                goto done;
            }
            Py_ssize_t size = dv.len, flen = PyUnicode_GET_LENGTH(field);
            if (size >= direct || flen > 255) {
                PyBuffer_Release(&dv);
                goto done;
            }
            memcpy(name + klen + 1, PyUnicode_1BYTE_DATA(field), (size_t)flen);
            Py_ssize_t nlen = klen + 1 + flen;
            if (pass == 0) {
                need += header_size(name, nlen) + PADDED(size);
                count++;
            } else {
                at = put_member(buf, cap, at, tm, name, nlen, dv.buf, size);
            }
            PyBuffer_Release(&dv);
        }
        if (got < 0)
            goto fail;
        if (pass == 0) {
            if (count == 0)
                goto done; /* no fields: the Python function names the error */
            if (need > cap - *used) {
                status = *used == 0 ? PACK_PYTHON : PACK_FULL;
                goto done;
            }
        }
    }
    status = PACK_DONE;
    *used = at;
    *written = count;
done:
    Py_DECREF(fields);
    return status;
fail:
    Py_DECREF(fields);
    return -1;
}

/* pack_samples(buf, used, samples, templates, direct, last_key)
 *     -> (used, members, count, last_key, status, item)
 *
 * TarWriter.write_samples (and write_sample): pack_one for each sample of the iterator `samples`
 * in turn, until one is not done (status PACK_FULL or PACK_PYTHON: item is that sample, for the
 * caller to write after writing buf out or with the Python writer, before calling again), the
 * iterator ends
 * (PACK_DONE, item None) or raises (PACK_RAISED: item is the exception, for the caller to raise
 * once it has counted what was packed). count samples of members members were packed; last_key
 * is the key of the last of them. */
enum { PACK_RAISED = 4 };

static PyObject *pack_samples(PyObject *self, PyObject *args)
{
    Py_buffer out, tm;
    Py_ssize_t used, direct, members = 0, count = 0;
    PyObject *samples, *last_key, *item = NULL;
    if (!PyArg_ParseTuple(args, "w*nOy*nO", &out, &used, &samples, &tm, &direct, &last_key))
        return NULL;
    int status = PACK_DONE;
    Templates templates;
    templates_init(&templates, tm.buf);
    Py_INCREF(last_key);
    if (tm.len != 3 * 512) {
        PyErr_Format(PyExc_ValueError, "pack_samples: templates must be 3 headers of 512 bytes, not %zd bytes",
                     tm.len);
        goto fail;
    }
    if (used < 0 || used > out.len || direct < 0) {
        PyErr_Format(PyExc_ValueError, "pack_samples: need 0 <= used <= len(buf) (%zd) and direct >= 0, not used "
                     "%zd, direct %zd", out.len, used, direct);
        goto fail;
    }
    if (!PyIter_Check(samples)) {
        PyErr_Format(PyExc_TypeError, "pack_samples: samples must be an iterator, not %.100s",
                     Py_TYPE(samples)->tp_name);
        goto fail;
    }
    for (;;) {
        item = PyIter_Next(samples);
        Py_ssize_t written;
        PyObject *key;
        status = item == NULL ? (PyErr_Occurred() ? -1 : PACK_DONE)
                              : pack_one(out.buf, out.len, &used, item, &templates, direct, last_key, &written, &key);
        if (status < 0) { /* what was packed is counted first: the caller raises the error after */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb != NULL)
                PyException_SetTraceback(value, tb);
            Py_XDECREF(type);
            Py_XDECREF(tb);
            Py_XSETREF(item, value);
            status = PACK_RAISED;
        }
        if (item == NULL || status != PACK_DONE)
            break;
        Py_INCREF(key);
        Py_SETREF(last_key, key);
        Py_CLEAR(item);
        members += written;
        count++;
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&tm);
    if (item == NULL) {
        item = Py_None;
        Py_INCREF(item);
    }
    return Py_BuildValue("nnnNiN", used, members, count, last_key, status, item);
fail:
    Py_XDECREF(item);
    Py_DECREF(last_key);
    PyBuffer_Release(&out);
    PyBuffer_Release(&tm);
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * Grouper(members, url, rules): samples.read_samples' grouping (samples._group_python is the
 * reference), an iterator of sample dicts over an iterator of (key, field, data, offset) members.
 * Members with the key of the sample being built go into it; a member with a new key hands that
 * sample out and starts the next. The rest -- a "__field__", a field the sample has already, a
 * member without a key, a key that starts with "_" or comes back after other keys -- goes to the
 * methods of `rules` (samples._Rules), which count, warn or raise as the Python grouper does; it
 * counts samples in rules.stats itself. A
 * member that starts a new key is kept until the sample before it has been handed out, so that
 * what rules says of it comes after, as in the Python generator.
 */
typedef struct {
    PyObject_HEAD
    PyObject *members;    /* the iterator of members */
    PyObject *url;
    PyObject *stats;      /* rules.stats, whose samples it counts */
    PyObject *on_metadata, *metadata_name, *no_key, *duplicate_field, *reappearing_key;
    PyObject *sample;     /* the sample being built, or NULL */
    PyObject **offsets;   /* field, offset, field, offset...: where that sample's fields were (owned) */
    Py_ssize_t noffsets, offsets_cap;
    PyObject *key_offset; /* key -> offset of its first member, once keys are not in order */
    PyObject *keys, *key_offsets; /* while every new key is greater than the one before: them, in order */
    PyObject *cur_key;    /* the key of the members being read, or NULL */
    PyObject *pending;    /* a member that starts a key, not handled yet, or NULL */
    int dropping;         /* the members of a reappearing key are dropped */
    int done;             /* ended, or raised: nothing more, as with a generator */
    int busy;             /* in __next__ (a callback must not call it again) */
} Grouper;

static void clear_offsets(Grouper *g)
{
    for (Py_ssize_t i = 0; i < g->noffsets; i++)
        Py_DECREF(g->offsets[i]);
    g->noffsets = 0;
}

/* Note where a field of the sample being built was: 0, or -1 on an error. */
static int add_offset(Grouper *g, PyObject *field, PyObject *offset)
{
    if (g->noffsets + 2 > g->offsets_cap) {
        Py_ssize_t cap = g->offsets_cap ? 2 * g->offsets_cap : 16;
        PyObject **more = PyMem_Realloc(g->offsets, (size_t)cap * sizeof(PyObject *));
        if (more == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        g->offsets = more;
        g->offsets_cap = cap;
    }
    Py_INCREF(field);
    Py_INCREF(offset);
    g->offsets[g->noffsets++] = field;
    g->offsets[g->noffsets++] = offset;
    return 0;
}

/* Where the sample being built has `field` (borrowed), or NULL. */
static PyObject *find_offset(Grouper *g, PyObject *field)
{
    for (Py_ssize_t i = 0; i < g->noffsets; i += 2) {
        PyObject *f = g->offsets[i];
        if (f == field)
            return g->offsets[i + 1];
        int eq = PyUnicode_Compare(f, field);
        if (eq == 0)
            return g->offsets[i + 1];
        if (eq == -1 && PyErr_Occurred())
            PyErr_Clear();
    }
    return NULL;
}

static int grouper_traverse(Grouper *g, visitproc visit, void *arg)
{
    Py_VISIT(g->members);
    Py_VISIT(g->url);
    Py_VISIT(g->stats);
    Py_VISIT(g->on_metadata);
    Py_VISIT(g->metadata_name);
    Py_VISIT(g->no_key);
    Py_VISIT(g->duplicate_field);
    Py_VISIT(g->reappearing_key);
    Py_VISIT(g->sample);
    Py_VISIT(g->key_offset);
    Py_VISIT(g->keys);
    Py_VISIT(g->key_offsets);
    Py_VISIT(g->cur_key);
    Py_VISIT(g->pending);
    for (Py_ssize_t i = 0; i < g->noffsets; i++)
        Py_VISIT(g->offsets[i]);
    return 0;
}

static int grouper_clear(Grouper *g)
{
    Py_CLEAR(g->members);
    Py_CLEAR(g->url);
    Py_CLEAR(g->stats);
    Py_CLEAR(g->on_metadata);
    Py_CLEAR(g->metadata_name);
    Py_CLEAR(g->no_key);
    Py_CLEAR(g->duplicate_field);
    Py_CLEAR(g->reappearing_key);
    Py_CLEAR(g->sample);
    Py_CLEAR(g->key_offset);
    Py_CLEAR(g->keys);
    Py_CLEAR(g->key_offsets);
    Py_CLEAR(g->cur_key);
    Py_CLEAR(g->pending);
    clear_offsets(g);
    g->done = 1;
    return 0;
}

static void grouper_dealloc(Grouper *g)
{
    PyObject_GC_UnTrack(g);
    grouper_clear(g);
    PyMem_Free(g->offsets);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

static PyObject *grouper_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *members, *url, *rules;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "Grouper takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOO", &members, &url, &rules))
        return NULL;
    if (!PyIter_Check(members)) {
        PyErr_SetString(PyExc_TypeError, "Grouper: members must be an iterator");
        return NULL;
    }
    Grouper *g = (Grouper *)type->tp_alloc(type, 0);
    if (g == NULL)
        return NULL;
    Py_INCREF(members);
    g->members = members;
    Py_INCREF(url);
    g->url = url;
    if ((g->stats = PyObject_GetAttrString(rules, "stats")) == NULL ||
        (g->on_metadata = PyObject_GetAttrString(rules, "metadata")) == NULL ||
        (g->metadata_name = PyObject_GetAttrString(rules, "metadata_name")) == NULL ||
        (g->no_key = PyObject_GetAttrString(rules, "no_key")) == NULL ||
        (g->duplicate_field = PyObject_GetAttrString(rules, "duplicate_field")) == NULL ||
        (g->reappearing_key = PyObject_GetAttrString(rules, "reappearing_key")) == NULL ||
        (g->keys = PyList_New(0)) == NULL || (g->key_offsets = PyList_New(0)) == NULL) {
        Py_DECREF(g);
        return NULL;
    }
    const char *names[] = {"metadata", "metadata_name", "no_key", "duplicate_field", "reappearing_key"};
    PyObject *calls[] = {g->on_metadata, g->metadata_name, g->no_key, g->duplicate_field, g->reappearing_key};
    for (int i = 0; i < 5; i++)
        if (!PyCallable_Check(calls[i])) {
            PyErr_Format(PyExc_TypeError, "Grouper: rules.%s must be callable, not %.100s", names[i],
                         Py_TYPE(calls[i])->tp_name);
            Py_DECREF(g);
            return NULL;
        }
    return (PyObject *)g;
}

static int starts_dunder(PyObject *s)
{
    return PyUnicode_GET_LENGTH(s) >= 2 && PyUnicode_READ_CHAR(s, 0) == '_' && PyUnicode_READ_CHAR(s, 1) == '_';
}

/* Call f(args...) for what it does; -1 on an error it raised. */
static int call_void(PyObject *f, PyObject *args)
{
    if (args == NULL)
        return -1;
    PyObject *r = PyObject_Call(f, args, NULL);
    Py_DECREF(args);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* A member with a new key (or none): 0 when handled (the sample before, if any, is to be handed
 * out first: the caller does that), -1 on an error. */
static int start_key(Grouper *g, PyObject *key, PyObject *field, PyObject *data, PyObject *offset)
{
    Py_INCREF(key);
    Py_XSETREF(g->cur_key, key);
    /* Has the key been seen before? In a tar made with --sort=name keys mostly come in order: while
     * each is greater than the last, none can have been, and they are only listed. A dict of a
     * shard's keys (hashing, and a lookup that misses the cache) is built only if one comes out of
     * order. */
    if (g->key_offset == NULL) {
        Py_ssize_t n = PyList_GET_SIZE(g->keys);
        int after = n == 0 ? 1 : PyUnicode_Compare(key, PyList_GET_ITEM(g->keys, n - 1)) > 0;
        if (after) {
            g->dropping = 0;
            if (PyList_Append(g->keys, key) < 0 || PyList_Append(g->key_offsets, offset) < 0)
                return -1;
            goto new_sample;
        }
        if (PyErr_Occurred() || (g->key_offset = PyDict_New()) == NULL)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++)
            if (PyDict_SetItem(g->key_offset, PyList_GET_ITEM(g->keys, i), PyList_GET_ITEM(g->key_offsets, i)) < 0)
                return -1;
        Py_CLEAR(g->keys);
        Py_CLEAR(g->key_offsets);
    }
    PyObject *first = PyDict_GetItemWithError(g->key_offset, key); /* borrowed */
    if (first == NULL && PyErr_Occurred())
        return -1;
    g->dropping = first != NULL;
    if (first != NULL)
        return call_void(g->reappearing_key, PyTuple_Pack(3, key, first, offset));
    if (PyDict_SetItem(g->key_offset, key, offset) < 0)
        return -1;
new_sample:;
    PyObject *sample = PyDict_New();
    clear_offsets(g);
    if (sample == NULL || PyDict_SetItem(sample, str_key, key) < 0 || PyDict_SetItem(sample, str_url, g->url) < 0 ||
        PyDict_SetItem(sample, field, data) < 0 || add_offset(g, field, offset) < 0) {
        Py_XDECREF(sample);
        return -1;
    }
    Py_XSETREF(g->sample, sample);
    return 0;
}

/* Hand out the sample built so far (a new reference), counting it in stats.samples (as
 * rules.sample does for the Python grouper). */
static PyObject *hand_out(Grouper *g)
{
    PyObject *sample = g->sample;
    g->sample = NULL;
    PyObject *n = PyObject_GetAttr(g->stats, str_samples), *n1 = NULL;
    if (n != NULL) {
        Py_ssize_t v = PyLong_AsSsize_t(n);
        if (v == PY_SSIZE_T_MAX)
            PyErr_SetString(PyExc_OverflowError, "Grouper: rules.stats.samples is at its largest");
        else if (!(v == -1 && PyErr_Occurred()))
            n1 = PyLong_FromSsize_t(v + 1);
        Py_DECREF(n);
    }
    if (n1 == NULL || PyObject_SetAttr(g->stats, str_samples, n1) < 0) {
        Py_XDECREF(n1);
        Py_DECREF(sample);
        return NULL;
    }
    Py_DECREF(n1);
    return sample;
}

static PyObject *grouper_step(Grouper *g);

static PyObject *grouper_next(Grouper *g)
{
    if (g->done)
        return NULL;
    if (g->busy) {
        PyErr_SetString(PyExc_ValueError, "Grouper already executing");
        return NULL;
    }
    g->busy = 1;
    PyObject *sample = grouper_step(g);
    g->busy = 0;
    if (sample == NULL) { /* the end, or an error: over either way, as for a generator */
        g->done = 1;
        Py_CLEAR(g->sample);
        Py_CLEAR(g->pending);
    }
    return sample;
}

static PyObject *grouper_step(Grouper *g)
{
    for (;;) {
        PyObject *item;
        if (g->pending != NULL) { /* the member that ended the sample handed out last */
            item = g->pending;
            g->pending = NULL;
        } else if ((item = PyIter_Next(g->members)) == NULL) {
            if (PyErr_Occurred())
                return NULL;
            g->done = 1;
            return g->sample != NULL ? hand_out(g) : NULL;
        }
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 4) {
            Py_DECREF(item);
            PyErr_SetString(PyExc_TypeError, "Grouper: members must be (key, field, data, offset) tuples");
            return NULL;
        }
        PyObject *key = PyTuple_GET_ITEM(item, 0), *field = PyTuple_GET_ITEM(item, 1);
        PyObject *data = PyTuple_GET_ITEM(item, 2), *offset = PyTuple_GET_ITEM(item, 3);
        if (!PyUnicode_Check(field) || (key != Py_None && !PyUnicode_Check(key))) {
            Py_DECREF(item);
            PyErr_SetString(PyExc_TypeError, "Grouper: a key is a str or None, a field a str");
            return NULL;
        }
        int err = 0;
        if (g->cur_key != NULL && key != Py_None &&
            (key == g->cur_key || PyUnicode_Compare(key, g->cur_key) == 0)) { /* the same key */
            if (g->dropping || g->sample == NULL) {
            } else if (starts_dunder(field)) {
                err = call_void(g->on_metadata, PyTuple_New(0));
            } else {
                int has = PyDict_Contains(g->sample, field);
                if (has < 0) {
                    err = -1;
                } else if (has) {
                    PyObject *first = find_offset(g, field); /* borrowed; always there */
                    err = call_void(g->duplicate_field, PyTuple_Pack(4, key, field, first ? first : Py_None, offset));
                } else if (PyDict_SetItem(g->sample, field, data) < 0 || add_offset(g, field, offset) < 0) {
                    err = -1;
                }
            }
            Py_DECREF(item);
            if (err < 0)
                return NULL;
            continue;
        }
        if (key == Py_None) {
            err = call_void(g->no_key, PyTuple_Pack(1, field));
            Py_DECREF(item);
            if (err < 0)
                return NULL;
            continue;
        }
        if ((PyUnicode_GET_LENGTH(key) > 0 && PyUnicode_READ_CHAR(key, 0) == '_') || starts_dunder(field)) {
            PyObject *r = PyObject_CallFunctionObjArgs(g->metadata_name, key, field, NULL);
            int skip = r == NULL ? -1 : PyObject_IsTrue(r);
            Py_XDECREF(r);
            if (skip != 0) {
                Py_DECREF(item);
                if (skip < 0)
                    return NULL;
                continue;
            }
        }
        /* a new key: the sample before goes out first, and this member waits for the next call */
        if (g->sample != NULL) {
            g->pending = item;
            return hand_out(g);
        }
        err = start_key(g, key, field, data, offset);
        Py_DECREF(item);
        if (err < 0)
            return NULL;
    }
}

static PyTypeObject GrouperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tarproc._speedups.Grouper",
    .tp_basicsize = sizeof(Grouper),
    .tp_dealloc = (destructor)grouper_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)grouper_traverse,
    .tp_clear = (inquiry)grouper_clear,
    .tp_doc = "Grouper(members, url, rules): sample dicts from (key, field, data, offset) members",
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)grouper_next,
    .tp_new = grouper_new,
};

static PyMethodDef methods[] = {
    {"members", members, METH_O, "members(sample) -> (key, [(name, value), ...]) or None: sample_members' common case"},
    {"scan", scan, METH_VARARGS,
     "scan(buf, pos, base, max_member_size, keyed[, views, refs, ref]) -> (items, new_pos, nbytes, last)"},
    {"index_file", index_file, METH_VARARGS,
     "index_file(fd, origin, max_member_size, entry_type) -> (entries, size, members, nbytes, directories) or None"},
    {"jsonl_lines", jsonl_lines, METH_VARARGS, "jsonl_lines(entries, encode) -> bytes or None: a tarproc index's sample lines"},
    {"set_range_type", set_range_type, METH_O, "set_range_type(tar.FileRange): data that pack and members pass on"},
    {"pack_samples", pack_samples, METH_VARARGS,
     "pack_samples(buf, used, samples, templates, direct, last_key) -> (used, members, count, last_key, status, item)"},
    {"pack", pack, METH_VARARGS, "pack(buf, used, members, start, templates, direct) -> (used, next, status)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", "Fast paths of the tar reader and writer.", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void)
{
    if ((str_key = PyUnicode_InternFromString("__key__")) == NULL ||
        (str_url = PyUnicode_InternFromString("__url__")) == NULL ||
        (str_samples = PyUnicode_InternFromString("samples")) == NULL || PyType_Ready(&GrouperType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&GrouperType);
    if (PyModule_AddObject(m, "Grouper", (PyObject *)&GrouperType) < 0) {
        Py_DECREF(&GrouperType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
