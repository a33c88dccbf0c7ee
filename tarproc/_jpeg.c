/*
 * tarproc._jpeg: the cpu decode backend's hot path, for training crops (optional; built when
 * libjpeg-turbo's headers are present, else tarproc uses simplejpeg + Pillow for everything).
 *
 * decode_region(data, x0, y0, x1, y1, denom[, num[, channels]]) decodes only the part of a JPEG that
 * a crop needs: the image is decoded at num/denom size (libjpeg's DCT scaling: any M/8, num
 * defaults to 1; x0..y1 are in the scaled image's pixels), columns outside [x0, x1) are not
 * inverse-transformed (jpeg_crop_scanline widens the range to whole iMCUs), rows above y0 are
 * entropy-decoded but not transformed (jpeg_skip_scanlines), and rows below y1 are not decoded at
 * all (their entropy decoding alone is about half of a full decode's time). libjpeg's warnings
 * (corrupt data, premature end) in the rows decoded are errors, as with simplejpeg's strict mode,
 * and a stream cut short anywhere (no end-of-image marker after the rows read) is an error whatever
 * the crop; other damage below the window leaves the window's pixels right and is not seen. Returns
 * (bytearray of RGBX rows -- RGB with channels=3 --, width, height, x_origin, y_origin), the origin being the decoded
 * area's top-left corner in the scaled image (it covers the region asked for, and a little more); or None for CMYK/YCCK images (the caller uses Pillow).
 * Where the JPEG has restart markers (relayout writes them) whose segments are a part of an MCU row
 * or whole rows, only the segments that the window (and two pixels, and two MCUs at least, around
 * it) intersects are entropy-decoded: they are made into a smaller JPEG (window_jpeg) decoded as
 * above, with the same pixels. Damage in those segments is an error as above; damage in the other
 * segments is not seen; a marker missing or out of sequence makes it decode from the top as a JPEG
 * without markers would be.
 * The entropy (Huffman) decoding of a baseline scan is this module's own (see "The entropy
 * decoder" below): the same coefficients as libjpeg's, so the same pixels, faster, and with restart
 * markers as fast as without (libjpeg-turbo decodes those bit by bit); it is stricter than libjpeg
 * on damage (a bad Huffman code, bytes left before a restart marker are errors here).
 *
 * relayout(data, interval=0, optimize=False) rewrites a baseline JPEG losslessly with a restart
 * marker every `interval` MCUs (libjpeg's transcoding: the same coefficients), keeping its markers
 * (EXIF, ICC...) and the bytes after it: bytes, or a str saying why it is left as it is
 * (progressive, restart markers, CMYK, arithmetic coding); damaged data is a ValueError.
 *
 * read_header(data) reads a JPEG's headers with libjpeg: (width, height, components), or a
 * ValueError in libjpeg's words (what a user can act on where simplejpeg says only -1).
 *
 * resample(src, width, height, box, out_w, out_h, flip, color, tables, mode, out) takes the
 * window `box` (x0, y0, x1, y1, floats, in src coordinates) of an RGBX image and writes it to `out`
 * resized to out_w x out_h with Pillow's antialiased bilinear filter -- the same coefficients,
 * fixed-point arithmetic and rounding as Pillow's Image.resize(size, BILINEAR, box), so the result
 * is identical -- then optionally the affine colour map `color` (12 floats, as Pillow's
 * convert("RGB", matrix)), the horizontal flip, and the per-channel lookup `tables` (3 x 256
 * float32: normalization) in one pass. mode: 0 uint8 HWC, 1 uint8 CHW, 2 float32 HWC, 3 float32 CHW.
 * Its two passes use AVX2 where the CPU has it (checked when the module loads), with the same
 * integer arithmetic as the portable C, so the bytes are the same; use_simd(False) selects the
 * portable passes (the tests compare the two).
 *
 * warp(src, width, height, matrix, out_w, out_h, flip, color, tables, mode, out) samples an RGB
 * image (3 bytes a pixel) at matrix (a, b, c, d, e, f) applied to each output pixel's centre,
 * bilinearly, black outside, as Pillow's transform(AFFINE, BILINEAR, fillcolor=black) does (in
 * single precision: within a level of it), and writes it out as resample does, the colour map in
 * the same pass (the rotation's second step). With AVX2 (and use_simd) and a spare byte after
 * src's last pixel, eight pixels at a time, giving the portable code's bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TARPROC_X86 1
#endif

struct error_manager {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
    int warned;
};

static void on_error(j_common_ptr cinfo)
{
    struct error_manager *err = (struct error_manager *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level)
{
    struct error_manager *err = (struct error_manager *)cinfo->err;
    if (level < 0 && !err->warned) { /* a warning: corrupt data, premature end of data */
        (*cinfo->err->format_message)(cinfo, err->message);
        err->warned = 1;
    }
}

/* a decompressor whose errors longjmp to err->jump (set by the caller) and whose warnings count */
static void new_decompressor(struct jpeg_decompress_struct *cinfo, struct error_manager *err)
{
    memset(cinfo, 0, sizeof(*cinfo));
    cinfo->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    err->warned = 0;
    err->message[0] = 0;
    jpeg_create_decompress(cinfo);
}

/* ------------------------------------------------------------------------------------------ */
/* Argument checks: every exported function checks its arguments before it reads or writes a     */
/* byte, raising TypeError or ValueError (OverflowError for a number beyond C's range) that says  */
/* which argument is wrong. Each check is O(1) per call: the per-pixel loops stay as they were.  */

/* The largest side, in pixels, that resample and warp take. JPEG's own limit is 65535; 2^20 keeps
   every product of sizes that the passes compute in an int (tap indexes, row strides, the AVX2
   passes' offsets) far below INT_MAX. */
#define MAX_SIDE (1 << 20)

/* libjpeg reads `len` bytes through an unsigned long (32 bits on some platforms). */
static int jpeg_length_ok(const Py_buffer *data, const char *func)
{
    if ((unsigned long long)data->len > (unsigned long long)ULONG_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s: data of %zd bytes is more than libjpeg can read", func, data->len);
        return 0;
    }
    return 1;
}

/* 1 where 1 <= w, h <= MAX_SIDE, else 0 with ValueError naming `what` (e.g. "width and height") */
static int side_ok(int w, int h, const char *func, const char *what)
{
    if (w < 1 || h < 1 || w > MAX_SIDE || h > MAX_SIDE) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be 1..%d, not %d x %d", func, what, MAX_SIDE, w, h);
        return 0;
    }
    return 1;
}

/* A double that converts to a finite float: NaN, infinities and values past FLT_MAX don't (their
   conversion to float is undefined behaviour, and NaN pixels would reach a float-to-byte cast). */
static int finite_float(double v)
{
    return fabs(v) <= (double)FLT_MAX;
}

/* A colour map's entries: at most this in size. A bigger one saturates every pixel anyway, and
   with this bound a row's sum of products (coefficients times levels of 0..255) stays finite: no
   inf - inf, no NaN reaching the cast to a byte. */
#define COLOR_LIMIT 65536.0

/* `obj` (a sequence of n numbers) into `to` as floats of size at most COLOR_LIMIT: 0, or -1 with
   TypeError or ValueError set, naming func and what ("color"). */
static int read_floats(PyObject *obj, Py_ssize_t n, float *to, const char *func, const char *what)
{
    PyObject *seq = PySequence_Fast(obj, "");
    if (seq == NULL) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be None or a sequence of %zd numbers, not %.100s", func, what, n,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    int r = 0;
    if (PySequence_Fast_GET_SIZE(seq) != n) {
        PyErr_Format(PyExc_ValueError, "%s: %s must hold %zd numbers, not %zd", func, what, n,
                     PySequence_Fast_GET_SIZE(seq));
        r = -1;
    }
    for (Py_ssize_t i = 0; r == 0 && i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        double v = PyFloat_AsDouble(item);
        if (v == -1.0 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Format(PyExc_TypeError, "%s: %s[%zd] must be a number, not %.100s", func, what, i,
                             Py_TYPE(item)->tp_name);
            }
            r = -1;
        } else if (!(fabs(v) <= COLOR_LIMIT)) {
            PyErr_Format(PyExc_ValueError, "%s: %s[%zd] must be finite, between -%d and %d", func, what, i,
                         (int)COLOR_LIMIT, (int)COLOR_LIMIT);
            r = -1;
        } else {
            to[i] = (float)v;
        }
    }
    Py_DECREF(seq);
    return r;
}

/* Whether a float32 mode's tables are each channel's (level - sub) * mul in float arithmetic, for
   the (sub, mul) pairs that follow them in the tables buffer (768 + 6 floats, as
   tarproc.decode.cpu.c_tables gives them): then a row can be computed, not looked up, with the very
   same floats. Checked entry by entry: anything else is looked up. */
static int tables_affine(const float *table, const float *pairs)
{
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++) {
            float d = (float)v - pairs[2 * c], r = d * pairs[2 * c + 1];
            if (memcmp(&r, &table[256 * c + v], sizeof r) != 0)
                return 0;
        }
    return 1;
}

/* The checks that resample and warp share: the output's size, mode, buffer and alignment, and the
   lookup tables of the float32 modes (copied into `table`: any buffer will do, aligned or not;
   `affine` set where the (sub, mul) pairs after them fit them, tables_affine). */
static int output_ok(const char *func, int out_w, int out_h, int mode, const Py_buffer *out, const Py_buffer *tables,
                     float *table, const float **affine)
{
    if (!side_ok(out_w, out_h, func, "out_w and out_h"))
        return 0;
    if (mode < 0 || mode > 3) {
        PyErr_Format(PyExc_ValueError, "%s: mode must be 0 (uint8 HWC), 1 (uint8 CHW), 2 (float32 HWC) or "
                     "3 (float32 CHW), not %d", func, mode);
        return 0;
    }
    size_t need = (size_t)out_w * (size_t)out_h * 3 * (mode >= 2 ? sizeof(float) : 1);
    if ((size_t)out->len < need) {
        PyErr_Format(PyExc_ValueError, "%s: out holds %zd bytes, a %d x %d image in mode %d needs %zu", func,
                     out->len, out_w, out_h, mode, need);
        return 0;
    }
    if (mode >= 2) {
        if ((uintptr_t)out->buf % sizeof(float) != 0) {
            PyErr_Format(PyExc_ValueError, "%s: out must be aligned to 4 bytes for the float32 modes", func);
            return 0;
        }
        if (tables->len < (Py_ssize_t)(3 * 256 * sizeof(float))) {
            PyErr_Format(PyExc_ValueError, "%s: tables holds %zd bytes, the float32 modes need 3 x 256 float32 "
                         "(3072)", func, tables->len);
            return 0;
        }
        memcpy(table, tables->buf, 3 * 256 * sizeof(float));
        if (tables->len >= (Py_ssize_t)((3 * 256 + 6) * sizeof(float))) {
            memcpy(table + 3 * 256, (const float *)tables->buf + 3 * 256, 6 * sizeof(float));
            *affine = tables_affine(table, table + 3 * 256) ? table + 3 * 256 : NULL;
        }
    }
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* Restart markers: the segments a window needs (decode_region) and the re-layout that writes  */
/* them (relayout). A restart marker resets the DC predictors, so the entropy-coded data        */
/* between two markers decodes on its own: a window needs only the segments it intersects.      */

#if JPEG_LIB_VERSION >= 70
#define MIN_DCT_SCALED_SIZE(c) ((c)->min_DCT_h_scaled_size)
#else
#define MIN_DCT_SCALED_SIZE(c) ((c)->min_DCT_scaled_size)
#endif

static size_t be16(const unsigned char *p)
{
    return ((size_t)p[0] << 8) | p[1];
}

/* How a scan's MCUs fall into restart segments, and which of them a window needs. A segment is
   either `seg_w` MCUs of one MCU row (the interval divides the row) or whole rows (`seg_rows` of
   them); other intervals mix rows and columns, and the window is decoded from the top as before. */
struct segment_plan {
    size_t per_band, bands;  /* segments across the image, and bands of segment rows down it */
    size_t s0, s1, b0, b1;   /* the segments the window needs: columns [s0, s1) of bands [b0, b1) */
    int sub_w, sub_h;        /* the smaller image those segments make, in image pixels */
    int ox, oy;              /* its top-left corner in the scaled image */
};

/* 1 where the window (x0, y0, x1, y1 in the scaled image, already inside it) can be decoded from
   fewer segments than today's path reads (every row down to the window's bottom), else 0. */
static int plan_segments(const struct jpeg_decompress_struct *c, int x0, int y0, int x1, int y1,
                         struct segment_plan *plan)
{
    if (c->restart_interval == 0 || c->progressive_mode || c->arith_code || c->comps_in_scan != c->num_components)
        return 0;
    int n = MIN_DCT_SCALED_SIZE(c); /* an 8-pixel block decodes to n x n pixels */
    size_t mw = c->num_components == 1 ? 8 : 8 * (size_t)c->max_h_samp_factor;
    size_t mh = c->num_components == 1 ? 8 : 8 * (size_t)c->max_v_samp_factor;
    size_t width = c->image_width, height = c->image_height, k = c->restart_interval;
    size_t per_row = (width + mw - 1) / mw, rows = (height + mh - 1) / mh, seg_w, seg_rows;
    if (per_row % k == 0) {
        seg_w = k;
        seg_rows = 1;
    } else if (k % per_row == 0) {
        seg_w = per_row;
        seg_rows = k / per_row;
    } else {
        return 0;
    }
    plan->per_band = per_row / seg_w;
    plan->bands = (rows + seg_rows - 1) / seg_rows;
    /* the MCUs under the window and two pixels around it: the smaller image's edge pixels are
       upsampled as an image edge (their chroma neighbour is missing), and two pixels keep every
       pixel of the window away from them, as the crop decode's own margin does for columns */
    long long sw = (long long)mw * n / 8, sh = (long long)mh * n / 8;
    long long xa = (long long)x0 - 2, xb = (long long)x1 + 2, ya = (long long)y0 - 2, yb = (long long)y1 + 2;
    long long c0 = xa < 0 ? 0 : xa / sw, c1 = (xb + sw - 1) / sw, r0 = ya < 0 ? 0 : ya / sh, r1 = (yb + sh - 1) / sh;
    if (c1 > (long long)per_row) c1 = (long long)per_row;
    if (r1 > (long long)rows) r1 = (long long)rows;
    /* at least two MCUs across and down: libjpeg-turbo upsamples an image whose chroma is two
       samples wide (3 or 4 pixels of 4:2:0) otherwise than the same columns of a wider image */
    if (c0 > c1 - 2) c0 = c1 - 2;
    if (r0 > r1 - 2) r0 = r1 - 2;
    if (c0 < 0) c0 = 0;
    if (r0 < 0) r0 = 0;
    plan->s0 = (size_t)c0 / seg_w;
    plan->s1 = ((size_t)c1 + seg_w - 1) / seg_w;
    plan->b0 = (size_t)r0 / seg_rows;
    plan->b1 = ((size_t)r1 + seg_rows - 1) / seg_rows;
    if (plan->b0 == 0 && plan->s0 == 0 && plan->s1 == plan->per_band)
        return 0; /* the rows above and the columns beside are all needed: nothing to skip */
    size_t x = plan->s0 * seg_w * mw, y = plan->b0 * seg_rows * mh;
    size_t xe = plan->s1 * seg_w * mw, ye = plan->b1 * seg_rows * mh;
    plan->sub_w = (int)((xe < width ? xe : width) - x);
    plan->sub_h = (int)((ye < height ? ye : height) - y);
    plan->ox = (int)(x / 8 * (size_t)n);
    plan->oy = (int)(y / 8 * (size_t)n);
    return 1;
}

/* The next marker at or after p in entropy-coded data, where 0xFF 0x00 is a stuffed 0xFF byte
   and 0xFF bytes before a marker are fill: its code byte (the byte after the fill), *first its
   first 0xFF; NULL where the data ends before one. */
static const unsigned char *next_marker(const unsigned char *p, const unsigned char *end, const unsigned char **first)
{
    for (;;) {
        const unsigned char *q = memchr(p, 0xFF, (size_t)(end - p));
        if (q == NULL)
            return NULL;
        const unsigned char *m = q + 1;
        while (m < end && *m == 0xFF)
            m++;
        if (m >= end)
            return NULL;
        if (*m != 0x00) {
            *first = q;
            return m;
        }
        p = m + 1;
    }
}

/* The segments of the scan starting at `at`, in one pass over its bytes: 0xFF 0x00 is a stuffed
   byte, 0xFF 0xD0..0xD7 the restart marker that ends segment i (numbered i mod 8), any other
   marker the end of the scan. Segment i's bytes are [start[i], stop[i]) (offsets in `base`).
   1: exactly `count` segments, in order, then the end-of-image marker. 0: the markers don't fit
   (one missing, misnumbered or extra, or the scan ended by another marker): the caller decodes
   from the top, with the damage rules of a stream without markers. -1: the data ends inside the
   scan (cut short). */
static int find_segments(const unsigned char *base, const unsigned char *at, const unsigned char *end, size_t count,
                         size_t *start, size_t *stop)
{
    size_t n = 0;
    start[0] = (size_t)(at - base);
    for (const unsigned char *p = at;;) {
        const unsigned char *q, *m = next_marker(p, end, &q);
        if (m == NULL)
            return -1;
        stop[n] = (size_t)(q - base);
        if (*m < 0xD0 || *m > 0xD7)
            return *m == 0xD9 && n + 1 == count ? 1 : 0;
        if ((size_t)(*m - 0xD0) != n % 8 || n + 1 >= count)
            return 0;
        start[++n] = (size_t)(m + 1 - base);
        p = m + 1;
    }
}

/* The headers before the scan's data (`buf` up to `sos_end`) as a smaller image's: the frame's
   height and width replaced, APP1..APP13, APP15 and COM left out (APP0 and APP14 stay: they say
   the colour space). Returns the bytes written to `to` (at most sos_end), or 0 where the headers
   don't parse as marker segments ending at sos_end. */
static size_t copy_headers(const unsigned char *buf, size_t sos_end, unsigned char *to, int width, int height)
{
    size_t p = 2, n = 2;
    to[0] = 0xFF;
    to[1] = 0xD8;
    while (p < sos_end) {
        if (buf[p] != 0xFF || p + 1 >= sos_end)
            return 0;
        unsigned int m = buf[p + 1];
        if (m == 0xFF) { /* fill byte */
            p++;
            continue;
        }
        if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) { /* markers without a length */
            p += 2;
            continue;
        }
        if (p + 4 > sos_end)
            return 0;
        size_t length = be16(buf + p + 2);
        if (length < 2 || p + 2 + length > sos_end)
            return 0;
        int dropped = (m >= 0xE1 && m <= 0xED) || m == 0xEF || m == 0xFE;
        if (!dropped) {
            memcpy(to + n, buf + p, 2 + length);
            int frame = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
            if (frame && length >= 7) {
                to[n + 5] = (unsigned char)(height >> 8);
                to[n + 6] = (unsigned char)height;
                to[n + 7] = (unsigned char)(width >> 8);
                to[n + 8] = (unsigned char)width;
            }
            n += 2 + length;
        }
        p += 2 + length;
    }
    return p == sos_end ? n : 0;
}

/* The window's segments as a JPEG of their own: the headers (copy_headers), the segments of
   `plan` in order with their restart markers renumbered, and an end-of-image marker. 1 with
   *out (malloc'd) and *out_len; 0 where the stream's markers don't fit the plan (decode it from
   the top); -1 where it is cut short; -2 out of memory. Touches no Python object (runs without
   the GIL). */
static int window_jpeg(const unsigned char *buf, size_t len, size_t sos_end, const struct segment_plan *plan,
                       unsigned char **out, size_t *out_len)
{
    size_t count = plan->per_band * plan->bands;
    if (count > len / 2 + 1) /* each segment but the last ends with a two-byte marker */
        return 0;
    size_t *start = malloc(sizeof(size_t) * count), *stop = malloc(sizeof(size_t) * count);
    if (start == NULL || stop == NULL) {
        free(start);
        free(stop);
        return -2;
    }
    int found = find_segments(buf, buf + sos_end, buf + len, count, start, stop);
    size_t need = sos_end + 2;
    for (size_t b = plan->b0; found == 1 && b < plan->b1; b++)
        for (size_t s = plan->s0; s < plan->s1; s++)
            need += stop[b * plan->per_band + s] - start[b * plan->per_band + s] + 2;
    unsigned char *to = found == 1 ? malloc(need) : NULL;
    if (found == 1 && to == NULL)
        found = -2;
    size_t n = found == 1 ? copy_headers(buf, sos_end, to, plan->sub_w, plan->sub_h) : 0;
    if (found == 1 && n == 0)
        found = 0;
    if (found == 1) {
        size_t marker = 0;
        for (size_t b = plan->b0; b < plan->b1; b++) {
            for (size_t s = plan->s0; s < plan->s1; s++) {
                size_t i = b * plan->per_band + s;
                if (marker > 0 || b > plan->b0 || s > plan->s0) {
                    to[n++] = 0xFF;
                    to[n++] = (unsigned char)(0xD0 + (marker++ % 8));
                }
                memcpy(to + n, buf + start[i], stop[i] - start[i]);
                n += stop[i] - start[i];
            }
        }
        to[n++] = 0xFF;
        to[n++] = 0xD9;
        *out = to;
        *out_len = n;
    } else {
        free(to);
    }
    free(start);
    free(stop);
    return found;
}

/* ------------------------------------------------------------------------------------------ */
/* Pixels: decode_region's output, in memory that is used again                               */
/*                                                                                              */
/* A decoded image is fresh memory, and the kernel faults in and zeroes every 4 KiB of it on the */
/* first write: about a third of a whole 500x375 image's decode where the images are kept a     */
/* while (a batch of 64 of them), since the allocator hands the freed ones back to the kernel.   */
/* So the blocks of Pixels objects that die are kept, up to CACHE_BLOCKS of them and CACHE_BYTES */
/* in all, and given to the next ones of about their size (Pillow's image memory arena does the  */
/* same). A Pixels object is a plain writable buffer (numpy.frombuffer, bytes, memoryview read   */
/* it); its block goes back when its last user (a numpy view included) lets go of it.           */

#define CACHE_BLOCKS 128
#define CACHE_BYTES ((size_t)128 << 20)
#define BLOCK_GRAIN ((size_t)64 << 10) /* block sizes are multiples of it, so that sizes meet */

static struct {
    unsigned char *data;
    size_t capacity;
} block_cache[CACHE_BLOCKS];
static int blocks_cached = 0;
static size_t bytes_cached = 0;

/* a block of at least `size` bytes (the GIL held): the smallest kept one of at most twice that
   (of those, the one kept last: its memory is the likeliest to be in a cache still), else new */
static unsigned char *take_block(size_t size, size_t *capacity)
{
    size_t want = (size + BLOCK_GRAIN - 1) / BLOCK_GRAIN * BLOCK_GRAIN;
    int best = -1;
    for (int i = blocks_cached - 1; i >= 0; i--)
        if (block_cache[i].capacity >= want && block_cache[i].capacity / 2 <= want &&
            (best < 0 || block_cache[i].capacity < block_cache[best].capacity))
            best = i;
    if (best < 0) {
        *capacity = want;
        return malloc(want ? want : 1);
    }
    unsigned char *data = block_cache[best].data;
    *capacity = block_cache[best].capacity;
    bytes_cached -= *capacity;
    block_cache[best] = block_cache[--blocks_cached];
    return data;
}

/* a block let go of (the GIL held): kept where there is room, else freed */
static void give_block(unsigned char *data, size_t capacity)
{
    if (blocks_cached < CACHE_BLOCKS && bytes_cached + capacity <= CACHE_BYTES) {
        block_cache[blocks_cached].data = data;
        block_cache[blocks_cached++].capacity = capacity;
        bytes_cached += capacity;
    } else {
        free(data);
    }
}

typedef struct {
    PyObject_HEAD
    unsigned char *data;
    Py_ssize_t size;
    size_t capacity;
} Pixels;

static void pixels_dealloc(Pixels *self)
{
    if (self->data != NULL)
        give_block(self->data, self->capacity);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int pixels_getbuffer(Pixels *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->size, 0, flags);
}

static Py_ssize_t pixels_length(Pixels *self)
{
    return self->size;
}

static PyBufferProcs pixels_buffer = {(getbufferproc)pixels_getbuffer, NULL};
static PySequenceMethods pixels_sequence = {.sq_length = (lenfunc)pixels_length};

static PyTypeObject PixelsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tarproc._jpeg.Pixels",
    .tp_basicsize = sizeof(Pixels),
    .tp_dealloc = (destructor)pixels_dealloc,
    .tp_as_sequence = &pixels_sequence,
    .tp_as_buffer = &pixels_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "decode_region's pixels: a writable buffer whose memory is used again once it is let go of",
};

/* a Pixels object of `size` bytes (not zeroed), *data its memory; NULL with MemoryError */
static PyObject *new_pixels(Py_ssize_t size, unsigned char **data)
{
    Pixels *self = PyObject_New(Pixels, &PixelsType);
    if (self == NULL)
        return NULL;
    self->data = take_block((size_t)size, &self->capacity);
    self->size = size;
    if (self->data == NULL) {
        Py_TYPE(self)->tp_free((PyObject *)self);
        return PyErr_NoMemory();
    }
    *data = self->data;
    return (PyObject *)self;
}

/* ------------------------------------------------------------------------------------------ */
/* The entropy decoder: baseline Huffman decoding of a sequential 8-bit scan, in place of         */
/* libjpeg's own (the rest of libjpeg -- IDCT, upsampling, colour -- is unchanged).               */
/*                                                                                              */
/* libjpeg-turbo decodes a scan with restart markers through its slow, bit-at-a-time path only     */
/* (jdhuff.c turns its fast path off whenever the restart interval is not 0), so the re-laid files */
/* that let a crop skip segments paid ~20% more per segment decoded. This one reads a 64-bit bit   */
/* buffer refilled eight bytes at a time where no 0xFF is among them, with a 10-bit lookup per     */
/* code and one more that gives an AC code with its value (run, value, length). Each symbol's      */
/* lookup waits for the previous one's length, so one stream decodes at the latency of that chain; */
/* restart segments are independent, so where a scan has them two segments are decoded at once,   */
/* symbol by symbol in turn (two chains the core overlaps), into a buffer the MCUs are served from. */
/* It writes the same coefficients as libjpeg (same zigzag, the same clamp of a run past 63) and  */
/* fails where libjpeg would warn (a segment that ends inside an MCU, a marker out of sequence,    */
/* data cut short), with libjpeg's words, and where libjpeg-turbo says nothing (a bad Huffman      */
/* code, which its fast path decodes as 0; whole bytes left before a restart marker): decode_region */
/* turns libjpeg's warnings into errors anyway. It takes over by replacing the decode_mcu method   */
/* of libjpeg's entropy decoder (the struct is jpegint.h's, whose layout is the same from libjpeg  */
/* 6b to libjpeg-turbo 3), after jpeg_start_decompress, for the scans it handles; any other scan   */
/* (progressive, arithmetic, 12-bit, not interleaved) is left to libjpeg.                         */

struct entropy_methods { /* jpegint.h's struct jpeg_entropy_decoder */
    void (*start_pass)(j_decompress_ptr cinfo);
    boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW *MCU_data);
    boolean insufficient_data;
};

#define FAST_BITS 10
static int own_entropy = 1; /* use_own_entropy(False): libjpeg's decoder (for tests) */
static int two_at_once = 1; /* use_own_entropy(True, False): one segment at a time (for tests) */

struct huffman {
    int32_t fast[1 << FAST_BITS];    /* (symbol << 8) | code length, 0 where the code is longer */
    int32_t fast_ac[1 << FAST_BITS]; /* (value << 16) | (run << 8) | code + magnitude length, 0: none */
    int64_t maxcode[18];             /* the largest code of each length (-1: none) */
    int valoff[18];                  /* huffval index of a code of that length, less the code */
    unsigned char huffval[256];
};

/* one entropy-coded stream: a segment, or the whole scan */
struct bitreader {
    uint64_t bits;                /* the bits not yet used, most significant first */
    int cnt, pad;                 /* bits in `bits`, of which the last `pad` are zeros past a marker */
    const unsigned char *p, *end; /* the next byte to read, the end of the data */
    int marker;                   /* the marker the data ran into (0: none yet) */
    const unsigned char *marker_at;
    int last_dc[MAX_COMPS_IN_SCAN];
    struct error_manager *err;
};

struct scan_decoder {
    struct bitreader r;
    unsigned int restarts_to_go, next_restart; /* MCUs left in the segment; the next RSTn's n */
    size_t mcus_left;                          /* in the scan */
    JCOEF *queue;                              /* MCUs decoded ahead (two segments at once) */
    size_t queued, served, queue_mcus;         /* MCUs in it, MCUs given out, its size */
    const struct huffman *dc[MAX_COMPS_IN_SCAN], *ac[MAX_COMPS_IN_SCAN]; /* per component of the scan */
    struct huffman tables[2 * NUM_HUFF_TBLS];
};

/* zigzag order to natural order, with the 16 extra entries libjpeg has for a run past the end */
static const int natural_order[64 + 16] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33, 40, 48,
    41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23,
    30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
    63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63};

static inline int extend(int v, int s)
{
    return v < (1 << (s - 1)) ? v - (1 << s) + 1 : v;
}

/* libjpeg's table (validated by libjpeg when the scan started) as lookups */
static void build_huffman(const JHUFF_TBL *t, struct huffman *h, int ac)
{
    int code = 0, k = 0;
    memset(h->fast, 0, sizeof(h->fast));
    memset(h->fast_ac, 0, sizeof(h->fast_ac));
    memcpy(h->huffval, t->huffval, sizeof(h->huffval));
    for (int l = 1; l <= 16; l++) {
        int n = t->bits[l];
        h->valoff[l] = k - code;
        for (int i = 0; i < n; i++, k++, code++) {
            if (l > FAST_BITS)
                continue;
            int sym = t->huffval[k], span = 1 << (FAST_BITS - l), first = code << (FAST_BITS - l);
            for (int j = 0; j < span; j++) {
                h->fast[first + j] = (sym << 8) | l;
                int run = sym >> 4, s = sym & 15;
                if (ac && s && l + s <= FAST_BITS) { /* the value's bits follow the code's */
                    int v = (j >> (FAST_BITS - l - s)) & ((1 << s) - 1);
                    h->fast_ac[first + j] = (int32_t)((uint32_t)extend(v, s) << 16) | (run << 8) | (l + s);
                }
            }
        }
        h->maxcode[l] = n ? code - 1 : -1;
        code <<= 1;
    }
    h->maxcode[17] = INT64_MAX; /* never reached: a code longer than 16 bits is bad */
}

static void scan_fail(struct error_manager *err, const char *message)
{
    snprintf(err->message, sizeof(err->message), "%s", message);
    longjmp(err->jump, 1);
}

/* the buffer refilled to at least 57 bits, a byte at a time: at a marker (0xFF then neither 0x00
   nor 0xFF), zeros, counted in pad; past the end of the data, an error */
static void refill_bytes(struct bitreader *r)
{
    while (r->cnt <= 56) {
        unsigned int b = 0;
        if (!r->marker) {
            if (r->p >= r->end)
                scan_fail(r->err, "Premature end of JPEG file");
            b = *r->p;
            if (b == 0xFF) {
                const unsigned char *q = r->p + 1;
                while (q < r->end && *q == 0xFF) /* fill bytes */
                    q++;
                if (q >= r->end)
                    scan_fail(r->err, "Premature end of JPEG file");
                if (*q == 0x00) {
                    r->p = q + 1;
                } else {
                    r->marker = *q;
                    r->marker_at = r->p;
                    b = 0;
                }
            } else {
                r->p++;
            }
        }
        if (r->marker)
            r->pad += 8;
        r->bits |= (uint64_t)b << (56 - r->cnt);
        r->cnt += 8;
    }
}

/* at least 57 bits: eight bytes at once where none is 0xFF (the partial byte past them is ORed in
   too, and ORed again, the same bits, by the next load), else refill_bytes */
static inline void fill(struct bitreader *r)
{
    if (r->cnt > 56)
        return;
    if (!r->marker && r->end - r->p >= 8) {
        uint64_t w;
        memcpy(&w, r->p, 8);
        uint64_t x = ~w; /* a 0xFF byte of w is a zero byte of x */
        if (((x - 0x0101010101010101ULL) & ~x & 0x8080808080808080ULL) == 0) {
            int n = (64 - r->cnt) >> 3;
            r->bits |= __builtin_bswap64(w) >> r->cnt;
            r->p += n;
            r->cnt += 8 * n;
            return;
        }
    }
    refill_bytes(r);
}

/* the next n bits, 1 <= n <= 16 (the buffer holds them) */
static inline unsigned int take(struct bitreader *r, int n)
{
    unsigned int v = (unsigned int)(r->bits >> (64 - n));
    r->bits <<= n;
    r->cnt -= n;
    return v;
}

/* a symbol whose code is longer than FAST_BITS */
static int long_symbol(struct bitreader *r, const struct huffman *h)
{
    int l = FAST_BITS + 1;
    int64_t code = (int64_t)(r->bits >> (64 - l));
    while (code > h->maxcode[l]) {
        l++;
        code = (int64_t)(r->bits >> (64 - l));
    }
    if (l > 16)
        scan_fail(r->err, "Corrupt JPEG data: bad Huffman code");
    r->bits <<= l;
    r->cnt -= l;
    return h->huffval[(h->valoff[l] + code) & 255];
}

/* one Huffman symbol (the buffer holds at least 16 bits) */
static inline int symbol(struct bitreader *r, const struct huffman *h)
{
    int32_t e = h->fast[r->bits >> (64 - FAST_BITS)];
    if (!e)
        return long_symbol(r, h);
    r->bits <<= e & 255;
    r->cnt -= e & 255;
    return e >> 8;
}

/* a block's DC coefficient (its difference added to the component's last) */
static inline void decode_dc(struct bitreader *r, const struct huffman *dc, int ci, JCOEF *block)
{
    fill(r);
    int s = symbol(r, dc);
    if (s) {
        fill(r);
        s = extend((int)take(r, s), s);
    }
    int last = r->last_dc[ci];
    if ((last >= 0 && s > INT_MAX - last) || (last < 0 && s < INT_MIN - last))
        scan_fail(r->err, "DCT coefficient out of range");
    r->last_dc[ci] = last + s;
    block[0] = (JCOEF)(last + s);
}

/* one AC symbol of a block, at zigzag index *k (and its value): *k moves past it, to 64 or more
   where the block ends */
static inline void decode_ac(struct bitreader *r, const struct huffman *ac, JCOEF *block, int *k)
{
    if (r->cnt < 32)
        fill(r);
    int32_t e = ac->fast_ac[r->bits >> (64 - FAST_BITS)];
    if (e) { /* a code and its value, together no longer than FAST_BITS */
        int at = *k + ((e >> 8) & 255);
        r->bits <<= e & 255;
        r->cnt -= e & 255;
        block[natural_order[at]] = (JCOEF)(e >> 16);
        *k = at + 1;
        return;
    }
    int rs = symbol(r, ac), run = rs >> 4, s = rs & 15;
    if (s) {
        int at = *k + run;
        block[natural_order[at]] = (JCOEF)extend((int)take(r, s), s);
        *k = at + 1;
    } else {
        *k = run == 15 ? *k + 16 : 64; /* sixteen zeros, or the end of the block */
    }
}

static void decode_block(struct bitreader *r, const struct scan_decoder *d, int ci, JCOEF *block)
{
    decode_dc(r, d->dc[ci], ci, block);
    for (int k = 1; k < 64;)
        decode_ac(r, d->ac[ci], block, &k);
}

/* a block of each of two segments, their symbols in turn */
static void decode_two_blocks(struct bitreader *a, struct bitreader *b, const struct scan_decoder *d, int ci,
                              JCOEF *block_a, JCOEF *block_b)
{
    const struct huffman *ac = d->ac[ci];
    decode_dc(a, d->dc[ci], ci, block_a);
    decode_dc(b, d->dc[ci], ci, block_b);
    int ka = 1, kb = 1;
    while (ka < 64 && kb < 64) {
        decode_ac(a, ac, block_a, &ka);
        decode_ac(b, ac, block_b, &kb);
    }
    while (ka < 64)
        decode_ac(a, ac, block_a, &ka);
    while (kb < 64)
        decode_ac(b, ac, block_b, &kb);
}

/* The end of a segment: libjpeg counts whole bytes left in its buffer, and any before the marker,
   as extraneous; the marker must be RSTn with the n expected. Returns the byte after the marker. */
static const unsigned char *segment_end(struct bitreader *r, unsigned int next_restart)
{
    if (r->cnt < r->pad) /* bits past the marker were used: the segment ended inside an MCU */
        scan_fail(r->err, "Corrupt JPEG data: premature end of data segment");
    unsigned int extra = (unsigned int)((r->cnt - r->pad) / 8);
    if (!r->marker) { /* the marker lies further on: everything before it is extra */
        const unsigned char *m = next_marker(r->p, r->end, &r->marker_at);
        if (m == NULL)
            scan_fail(r->err, "Premature end of JPEG file");
        r->marker = *m;
        extra += (unsigned int)(r->marker_at - r->p);
    }
    char message[JMSG_LENGTH_MAX];
    if (extra) {
        snprintf(message, sizeof(message), "Corrupt JPEG data: %u extraneous bytes before marker 0x%02x", extra,
                 r->marker);
        scan_fail(r->err, message);
    }
    if (r->marker != (int)(0xD0 + next_restart)) {
        snprintf(message, sizeof(message), "Corrupt JPEG data: found marker 0x%02x instead of RST%u", r->marker,
                 next_restart);
        scan_fail(r->err, message);
    }
    const unsigned char *q = r->marker_at + 1;
    while (*q == 0xFF)
        q++;
    return q + 1;
}

/* a reader at the start of the segment at `p` */
static void start_segment(struct bitreader *r, const unsigned char *p)
{
    r->p = p;
    r->marker = 0;
    r->bits = 0;
    r->cnt = r->pad = 0;
    memset(r->last_dc, 0, sizeof(r->last_dc));
}

/* the byte after the restart marker that ends the segment starting at p, or NULL where the next
   marker is another (the scan's end) or there is none */
static const unsigned char *after_restart_marker(const unsigned char *p, const unsigned char *end)
{
    const unsigned char *first, *m = next_marker(p, end, &first);
    return m != NULL && *m >= 0xD0 && *m <= 0xD7 ? m + 1 : NULL;
}

/* At the start of a segment with another after it in the scan: both decoded at once into the
   queue (the first's end checked), the reader left at the second's end. 0 where they can't be
   (no memory, no restart marker next): the caller decodes one MCU at a time. */
static int decode_two_segments(j_decompress_ptr cinfo, struct scan_decoder *d)
{
    size_t k = cinfo->restart_interval, second = d->mcus_left - k < k ? d->mcus_left - k : k;
    int blocks = cinfo->blocks_in_MCU;
    if (d->queue_mcus < 2 * k) {
        if (2 * k * (size_t)blocks > ((size_t)1 << 16)) /* 8 MB of coefficients: one at a time */
            return 0;
        JCOEF *bigger = realloc(d->queue, 2 * k * (size_t)blocks * DCTSIZE2 * sizeof(JCOEF));
        if (bigger == NULL)
            return 0;
        d->queue = bigger;
        d->queue_mcus = 2 * k;
    }
    const unsigned char *b_start = after_restart_marker(d->r.p, d->r.end);
    if (b_start == NULL)
        return 0;
    struct bitreader b = d->r;
    start_segment(&b, b_start);
    size_t mcu_size = (size_t)blocks * DCTSIZE2;
    memset(d->queue, 0, (k + second) * mcu_size * sizeof(JCOEF));
    JCOEF *qa = d->queue, *qb = d->queue + k * mcu_size;
    for (size_t m = 0; m < k; m++)
        for (int i = 0; i < blocks; i++) {
            JCOEF *block_a = qa + (m * blocks + i) * DCTSIZE2;
            int ci = cinfo->MCU_membership[i];
            if (m < second)
                decode_two_blocks(&d->r, &b, d, ci, block_a, qb + (m * blocks + i) * DCTSIZE2);
            else
                decode_block(&d->r, d, ci, block_a);
        }
    if (segment_end(&d->r, d->next_restart) != b_start) /* the second began at another marker */
        scan_fail(d->r.err, "Corrupt JPEG data: restart markers out of place");
    if (b.cnt < b.pad) /* the second ended inside an MCU (checked again if a segment follows) */
        scan_fail(b.err, "Corrupt JPEG data: premature end of data segment");
    d->next_restart = (d->next_restart + 1) & 7;
    d->r = b;
    d->queued = k + second;
    d->served = 0;
    d->mcus_left -= k + second;
    d->restarts_to_go = 0; /* the second segment's end is checked as the next begins */
    return 1;
}

static boolean decode_mcu_fast(j_decompress_ptr cinfo, JBLOCKROW *MCU_data)
{
    struct scan_decoder *d = (struct scan_decoder *)cinfo->client_data;
    int blocks = cinfo->blocks_in_MCU;
    if (d->served == d->queued && cinfo->restart_interval) {
        if (d->restarts_to_go == 0) {
            start_segment(&d->r, segment_end(&d->r, d->next_restart));
            d->next_restart = (d->next_restart + 1) & 7;
            d->restarts_to_go = cinfo->restart_interval;
        }
        if (!(two_at_once && d->restarts_to_go == cinfo->restart_interval && d->mcus_left > cinfo->restart_interval &&
              decode_two_segments(cinfo, d)))
            d->restarts_to_go--;
    }
    if (d->served < d->queued) { /* decoded ahead */
        const JCOEF *from = d->queue + d->served++ * (size_t)blocks * DCTSIZE2;
        for (int i = 0; MCU_data && i < blocks; i++)
            memcpy(MCU_data[i][0], from + i * DCTSIZE2, DCTSIZE2 * sizeof(JCOEF));
    } else {
        JCOEF scratch[DCTSIZE2];
        for (int i = 0; i < blocks; i++)
            decode_block(&d->r, d, cinfo->MCU_membership[i], MCU_data ? MCU_data[i][0] : scratch);
        d->mcus_left--;
        if (d->r.cnt < d->r.pad) /* bits past the marker were used: the segment ended inside this MCU */
            scan_fail(d->r.err, "Corrupt JPEG data: premature end of data segment");
    }
    /* where libjpeg's marker reader takes over after the scan */
    cinfo->src->next_input_byte = d->r.marker ? d->r.marker_at : d->r.p;
    cinfo->src->bytes_in_buffer = (size_t)(d->r.end - cinfo->src->next_input_byte);
    return TRUE;
}

static void free_scan_decoder(struct scan_decoder *d)
{
    if (d != NULL)
        free(d->queue);
    free(d);
}

/* Take over the scan's entropy decoding where it is one this decoder handles: after
   jpeg_start_decompress, before any MCU is decoded. 1 if it did (d holds its state; its queue is
   the caller's to free). */
static int take_over_scan(j_decompress_ptr cinfo, struct scan_decoder *d, struct error_manager *err)
{
    if (cinfo->progressive_mode || cinfo->arith_code || cinfo->data_precision != 8 ||
        cinfo->comps_in_scan != cinfo->num_components || cinfo->comps_in_scan > MAX_COMPS_IN_SCAN ||
        cinfo->Ss != 0 || cinfo->Se != 63 || cinfo->Ah != 0 || cinfo->Al != 0 || cinfo->entropy == NULL ||
        cinfo->input_iMCU_row != 0 || cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU)
        return 0;
    memset(d, 0, offsetof(struct scan_decoder, tables));
    int built_dc[NUM_HUFF_TBLS] = {0}, built_ac[NUM_HUFF_TBLS] = {0};
    for (int ci = 0; ci < cinfo->comps_in_scan; ci++) {
        const jpeg_component_info *c = cinfo->cur_comp_info[ci];
        int dn = c->dc_tbl_no, an = c->ac_tbl_no;
        if (dn < 0 || dn >= NUM_HUFF_TBLS || an < 0 || an >= NUM_HUFF_TBLS || !cinfo->dc_huff_tbl_ptrs[dn] ||
            !cinfo->ac_huff_tbl_ptrs[an])
            return 0;
        if (!built_dc[dn])
            build_huffman(cinfo->dc_huff_tbl_ptrs[dn], &d->tables[dn], 0);
        if (!built_ac[an])
            build_huffman(cinfo->ac_huff_tbl_ptrs[an], &d->tables[NUM_HUFF_TBLS + an], 1);
        built_dc[dn] = built_ac[an] = 1;
        d->dc[ci] = &d->tables[dn];
        d->ac[ci] = &d->tables[NUM_HUFF_TBLS + an];
    }
    d->r.p = cinfo->src->next_input_byte;
    d->r.end = d->r.p + cinfo->src->bytes_in_buffer;
    d->r.err = err;
    d->restarts_to_go = cinfo->restart_interval;
    d->mcus_left = (size_t)cinfo->MCUs_per_row * cinfo->MCU_rows_in_scan;
    cinfo->client_data = d;
    ((struct entropy_methods *)cinfo->entropy)->decode_mcu = decode_mcu_fast;
    return 1;
}

static PyObject *decode_region(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer data;
    int x0, y0, x1, y1, denom, num = 1, channels = 4;
    if (!PyArg_ParseTuple(args, "y*iiiii|ii", &data, &x0, &y0, &x1, &y1, &denom, &num, &channels))
        return NULL;
    /* denom's bound keeps libjpeg's unsigned products of the scale (num * 8, denom * 16) exact */
    if (denom < 1 || denom > MAX_SIDE || num < 1 || (long long)num > 16LL * denom) {
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError, "decode_region: bad scale %d/%d: need 1 <= denom <= %d and "
                     "1 <= num <= 16 * denom", num, denom, MAX_SIDE);
        return NULL;
    }
    if (channels != 3 && channels != 4) {
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError, "decode_region: channels must be 3 (RGB) or 4 (RGBX), not %d", channels);
        return NULL;
    }
    if (x1 <= x0 || y1 <= y0) {
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError, "decode_region: empty window (%d, %d, %d, %d): need x0 < x1 and y0 < y1",
                     x0, y0, x1, y1);
        return NULL;
    }
    if (!jpeg_length_ok(&data, "decode_region")) {
        PyBuffer_Release(&data);
        return NULL;
    }
    struct jpeg_decompress_struct cinfo;
    struct error_manager err;
    PyObject *result = NULL;
    PyObject *volatile out = NULL;
    PyThreadState *volatile released = NULL; /* the GIL, while libjpeg works */
    unsigned char *volatile window = NULL;   /* the window's restart segments as a JPEG of their own */
    struct scan_decoder *volatile scan = NULL; /* our entropy decoder's state, where it takes over */
    new_decompressor(&cinfo, &err);
    if (setjmp(err.jump)) { /* libjpeg failed: take the GIL back before touching Python objects */
        if (released != NULL)
            PyEval_RestoreThread(released);
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        Py_XDECREF(out);
        free(window);
        free_scan_decoder(scan);
        PyErr_SetString(PyExc_ValueError, err.message[0] ? err.message : "JPEG decoding failed");
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)data.buf;
    jpeg_mem_src(&cinfo, buf, (unsigned long)data.len);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        Py_RETURN_NONE;
    }
    cinfo.out_color_space = channels == 3 ? JCS_RGB : JCS_EXT_RGBX;
    cinfo.scale_num = (unsigned int)num;
    cinfo.scale_denom = (unsigned int)denom;
    cinfo.dct_method = JDCT_ISLOW;
    jpeg_calc_output_dimensions(&cinfo);
    int width = (int)cinfo.output_width, height = (int)cinfo.output_height;
    if (x1 <= 0 || y1 <= 0 || x0 >= width || y0 >= height) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError, "decode_region: window (%d, %d, %d, %d) lies outside the %d x %d image "
                     "(decoded at %d/%d)", x0, y0, x1, y1, width, height, num, denom * 8);
        return NULL;
    }
    /* with restart markers, decode only the segments the window intersects: they make a smaller
       JPEG (same tables, the frame's size cut to them), decoded below as any other, its origin
       (ox, oy) added back. Its pixels in the window are the whole image's: the same blocks, the
       same upsampling (a margin of one MCU around the window keeps the neighbours it reads). */
    int ox = 0, oy = 0;
    struct segment_plan plan;
    if (plan_segments(&cinfo, x0, y0, x1, y1, &plan)) {
        size_t sos_end = (size_t)(cinfo.src->next_input_byte - buf), window_len = 0;
        unsigned char *made = NULL;
        released = PyEval_SaveThread();
        int found = window_jpeg(buf, (size_t)data.len, sos_end, &plan, &made, &window_len);
        PyEval_RestoreThread(released);
        released = NULL;
        window = made;
        if (found < 0) {
            jpeg_destroy_decompress(&cinfo);
            PyBuffer_Release(&data);
            if (found == -2)
                return PyErr_NoMemory();
            PyErr_SetString(PyExc_ValueError, "Premature end of JPEG file (no end-of-image marker: the data is cut short)");
            return NULL;
        }
        if (found == 1) {
            jpeg_abort_decompress(&cinfo);
            jpeg_mem_src(&cinfo, window, (unsigned long)window_len);
            jpeg_read_header(&cinfo, TRUE);
            cinfo.out_color_space = channels == 3 ? JCS_RGB : JCS_EXT_RGBX;
            cinfo.scale_num = (unsigned int)num;
            cinfo.scale_denom = (unsigned int)denom;
            cinfo.dct_method = JDCT_ISLOW;
            ox = plan.ox;
            oy = plan.oy;
            x0 -= ox;
            x1 -= ox;
            y0 -= oy;
            y1 -= oy;
        }
    }
    jpeg_start_decompress(&cinfo);
    width = (int)cinfo.output_width;
    height = (int)cinfo.output_height;
    /* the outermost decoded columns of a cropped decode are upsampled as an image edge (their
       chroma neighbours are missing): decode two more on each side, so the region asked for
       gets exactly the pixels of a full decode. Clamped to the image before the widening, which
       then cannot pass INT_MIN or INT_MAX. */
    if (x0 < 2) x0 = 2;
    if (y0 < 0) y0 = 0;
    if (x1 > width - 2) x1 = width - 2;
    if (y1 > height) y1 = height;
    x0 -= 2;
    x1 += 2;
    JDIMENSION xoffset = (JDIMENSION)x0, cropped = (JDIMENSION)(x1 - x0);
    if (x0 > 0 || x1 < width)
        jpeg_crop_scanline(&cinfo, &xoffset, &cropped);
    int rows = y1 - y0, stride = (int)cinfo.output_width * channels;
    unsigned char *pixels = NULL;
    out = new_pixels((Py_ssize_t)stride * rows, &pixels);
    if (out == NULL) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        free(window);
        return NULL;
    }
    if (own_entropy) {
        struct scan_decoder *made = malloc(sizeof(struct scan_decoder));
        if (made != NULL && !take_over_scan(&cinfo, made, &err)) {
            free(made); /* its queue is still NULL */
            made = NULL;
        }
        scan = made; /* where it is NULL (no memory, or a scan it leaves to libjpeg), libjpeg decodes */
    }
    released = PyEval_SaveThread();
    if (y0 > 0)
        jpeg_skip_scanlines(&cinfo, (JDIMENSION)y0);
    while ((int)cinfo.output_scanline < y1) {
        JSAMPROW row = pixels + (size_t)stride * ((int)cinfo.output_scanline - y0);
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    int cut_short = 0;
    if ((int)cinfo.output_scanline < height) {
        /* the rows below the region are not decoded: their entropy decoding alone costs about half
           of a full decode. A stream cut short (the damage a download or a copy leaves) is still an
           error: the end-of-image marker must follow. In entropy-coded data a 0xFF byte is always
           followed by 0x00 or a restart marker, so 0xFF 0xD9 past the read position is the EOI */
        const unsigned char *at = cinfo.src->next_input_byte, *end = at + cinfo.src->bytes_in_buffer;
        /* a multi-scan (progressive) stream was read whole by jpeg_start_decompress, and the
           entropy decoder may have met the EOI already */
        cut_short = !jpeg_input_complete(&cinfo) && cinfo.unread_marker != 0xD9;
        for (const unsigned char *p = end - 1; cut_short && p > at; p--)
            if (p[0] == 0xD9 && p[-1] == 0xFF) { cut_short = 0; break; }
        jpeg_abort_decompress(&cinfo);
    } else {
        jpeg_finish_decompress(&cinfo);
    }
    PyEval_RestoreThread(released);
    released = NULL;
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    free(window);
    window = NULL;
    free_scan_decoder(scan);
    scan = NULL;
    if (err.warned || cut_short) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, err.warned ? err.message
                        : "Premature end of JPEG file (no end-of-image marker: the data is cut short)");
        return NULL;
    }
    result = Py_BuildValue("(Niiii)", out, (int)cinfo.output_width, rows, (int)xoffset + ox, y0 + oy);
    return result;
}

/* The restart interval relayout chooses for a scan of `rows` rows of `per_row` MCUs, from a file
   of `size` bytes: the divisor of the row that cuts it into the number of segments nearest 16 (at
   most 32), so that a crop of part of the width entropy-decodes little more than its own columns
   (16 across decode ImageNet-like crops ~5% faster than 8, and cost +1.1% in size, not +0.5%:
   bench/bench_train.py's note); fewer where the markers (about 4 bytes each, with the DC values
   they reset) would cost more than about 2% of the file: one segment a row, or a segment of
   several rows for a small file. A row whose divisors give no such cut (a prime number of MCUs)
   gets one segment a row. */
static unsigned int auto_interval(size_t per_row, size_t rows, size_t size)
{
    size_t budget = size / 200, best = 0;
    double best_score = 1e9;
    for (size_t d = 1; d <= per_row; d++) {
        size_t across = per_row / d;
        if (per_row % d != 0 || across > 32 || across * rows > budget)
            continue;
        double score = fabs(log((double)across / 16.0));
        if (score < best_score) {
            best_score = score;
            best = d;
        }
    }
    if (best == 0) /* not even a segment a row fits the budget: segments of several rows */
        best = per_row * (budget == 0 ? rows : (rows + budget - 1) / budget);
    return best > 65535 ? 65535 : (unsigned int)best;
}

/* Give `dst` the Huffman tables of `src`, table for table and component for component, where they
   can code the re-laid data: the coefficients are the same, so every AC symbol is in them; only
   the first DC difference of each segment changes (taken from 0, not from the block before), so
   each DC table must code every category a DC value can have (0..11, as the standard tables do).
   1 where they were given (no statistics pass, the size grows by the markers alone), 0 where the
   tables must be optimized instead. */
static int keep_tables(const struct jpeg_decompress_struct *src, struct jpeg_compress_struct *dst)
{
    for (int i = 0; i < NUM_HUFF_TBLS; i++) {
        const JHUFF_TBL *dc = src->dc_huff_tbl_ptrs[i];
        if (dc == NULL)
            continue;
        int count = 0, seen[16] = {0};
        for (int l = 1; l <= 16; l++)
            count += dc->bits[l];
        for (int k = 0; k < count && k < 256; k++)
            if (dc->huffval[k] < 16)
                seen[dc->huffval[k]] = 1;
        for (int c = 0; c < 12; c++)
            if (!seen[c])
                return 0;
    }
    for (int c = 0; c < src->num_components; c++) {
        int d = src->comp_info[c].dc_tbl_no, a = src->comp_info[c].ac_tbl_no;
        if (d < 0 || d >= NUM_HUFF_TBLS || a < 0 || a >= NUM_HUFF_TBLS || src->dc_huff_tbl_ptrs[d] == NULL ||
            src->ac_huff_tbl_ptrs[a] == NULL)
            return 0;
    }
    for (int i = 0; i < NUM_HUFF_TBLS; i++) {
        JHUFF_TBL **pairs[2][2] = {{&dst->dc_huff_tbl_ptrs[i], (JHUFF_TBL **)&src->dc_huff_tbl_ptrs[i]},
                                   {&dst->ac_huff_tbl_ptrs[i], (JHUFF_TBL **)&src->ac_huff_tbl_ptrs[i]}};
        for (int j = 0; j < 2; j++) {
            const JHUFF_TBL *from = *pairs[j][1];
            if (from == NULL)
                continue;
            if (*pairs[j][0] == NULL)
                *pairs[j][0] = jpeg_alloc_huff_table((j_common_ptr)dst);
            memcpy((*pairs[j][0])->bits, from->bits, sizeof(from->bits));
            memcpy((*pairs[j][0])->huffval, from->huffval, sizeof(from->huffval));
            (*pairs[j][0])->sent_table = FALSE;
        }
    }
    for (int c = 0; c < src->num_components; c++) {
        dst->comp_info[c].dc_tbl_no = src->comp_info[c].dc_tbl_no;
        dst->comp_info[c].ac_tbl_no = src->comp_info[c].ac_tbl_no;
    }
    return 1;
}

/* relayout(data, interval=0, optimize=False) -> bytes, or a str saying why the JPEG is left as it
   is ("progressive", "restart markers", "CMYK", "arithmetic coding"). The same coefficients
   written again (libjpeg's transcoding, as jpegtran -restart does), with a restart marker every
   `interval` MCUs (0: auto_interval's choice) and the input's Huffman tables (keep_tables), or
   tables optimized for the image where those can't be kept or with `optimize` (a pass more: a few
   percent smaller, about half the speed): the decoded pixels are the input's. The APPn and COM markers are copied (EXIF, ICC
   profiles, XMP), and so are the bytes after the end-of-image marker. Damaged data (a libjpeg
   error or warning: cut short, corrupt) is a ValueError in libjpeg's words. Runs without the GIL. */
static PyObject *relayout(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer data;
    int interval = 0, optimize = 0;
    if (!PyArg_ParseTuple(args, "y*|ip", &data, &interval, &optimize))
        return NULL;
    if (interval < 0 || interval > 65535) {
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError, "relayout: interval must be 0 (chosen from the width) to 65535 MCUs, not %d",
                     interval);
        return NULL;
    }
    if (!jpeg_length_ok(&data, "relayout")) {
        PyBuffer_Release(&data);
        return NULL;
    }
    struct jpeg_decompress_struct src;
    struct jpeg_compress_struct dst;
    struct error_manager err;
    unsigned char *outbuf = NULL; /* libjpeg's (malloc'd, grown as it writes); ours to free */
    unsigned long outsize = 0;
    const char *volatile reason = NULL;
    PyThreadState *volatile released = NULL;
    new_decompressor(&src, &err);
    memset(&dst, 0, sizeof(dst));
    dst.err = &err.pub; /* one error manager: either's failure jumps here */
    jpeg_create_compress(&dst);
    if (setjmp(err.jump)) {
        if (released != NULL)
            PyEval_RestoreThread(released);
        jpeg_destroy_compress(&dst);
        jpeg_destroy_decompress(&src);
        free(outbuf);
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, err.message[0] ? err.message : "JPEG transcoding failed");
        return NULL;
    }
    released = PyEval_SaveThread();
    jpeg_mem_src(&src, (const unsigned char *)data.buf, (unsigned long)data.len);
    jpeg_save_markers(&src, JPEG_COM, 0xFFFF);
    for (int m = 0; m < 16; m++)
        jpeg_save_markers(&src, JPEG_APP0 + m, 0xFFFF);
    jpeg_read_header(&src, TRUE);
    if (src.jpeg_color_space == JCS_CMYK || src.jpeg_color_space == JCS_YCCK)
        reason = "CMYK";
    else if (src.progressive_mode)
        reason = "progressive";
    else if (src.arith_code)
        reason = "arithmetic coding";
    else if (src.restart_interval != 0)
        reason = "restart markers";
    size_t trailing = 0;
    if (reason == NULL) {
        jvirt_barray_ptr *coefficients = jpeg_read_coefficients(&src);
        if (err.warned)
            longjmp(err.jump, 1); /* damaged: err.message says how */
        jpeg_copy_critical_parameters(&src, &dst);
        dst.optimize_coding = optimize || !keep_tables(&src, &dst) ? TRUE : FALSE;
        size_t mw = src.num_components == 1 ? 8 : 8 * (size_t)src.max_h_samp_factor;
        size_t mh = src.num_components == 1 ? 8 : 8 * (size_t)src.max_v_samp_factor;
        dst.restart_interval = interval ? (unsigned int)interval
                                        : auto_interval((src.image_width + mw - 1) / mw,
                                                        (src.image_height + mh - 1) / mh, (size_t)data.len);
        jpeg_mem_dest(&dst, &outbuf, &outsize);
        jpeg_write_coefficients(&dst, coefficients);
        for (jpeg_saved_marker_ptr m = src.marker_list; m != NULL; m = m->next) {
            /* the JFIF and Adobe markers that libjpeg writes itself are not written twice */
            if (dst.write_JFIF_header && m->marker == JPEG_APP0 && m->data_length >= 5 &&
                memcmp(m->data, "JFIF", 5) == 0)
                continue;
            if (dst.write_Adobe_marker && m->marker == JPEG_APP0 + 14 && m->data_length >= 5 &&
                memcmp(m->data, "Adobe", 5) == 0)
                continue;
            jpeg_write_marker(&dst, m->marker, m->data, m->data_length);
        }
        jpeg_finish_compress(&dst);
        jpeg_finish_decompress(&src);
        if (err.warned)
            longjmp(err.jump, 1);
        trailing = src.src->bytes_in_buffer;
    }
    PyEval_RestoreThread(released);
    released = NULL;
    PyObject *result;
    if (reason != NULL) {
        result = PyUnicode_FromString(reason);
    } else {
        result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(outsize + trailing));
        if (result != NULL) {
            memcpy(PyBytes_AS_STRING(result), outbuf, outsize);
            memcpy(PyBytes_AS_STRING(result) + outsize, (const char *)data.buf + data.len - trailing, trailing);
        }
    }
    jpeg_destroy_compress(&dst);
    jpeg_destroy_decompress(&src);
    free(outbuf);
    PyBuffer_Release(&data);
    return result;
}

/* read_header(data) -> (width, height, components): libjpeg's reading of the headers up to the first
   scan, raising ValueError with libjpeg's own words (e.g. "JPEG datastream contains no image") when
   it fails: what a user reads when simplejpeg says only -1 */
static PyObject *read_header(PyObject *Py_UNUSED(self), PyObject *arg)
{
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0)
        return NULL;
    if (!jpeg_length_ok(&data, "read_header")) {
        PyBuffer_Release(&data);
        return NULL;
    }
    struct jpeg_decompress_struct cinfo;
    struct error_manager err;
    new_decompressor(&cinfo, &err);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, err.message[0] ? err.message : "JPEG header unreadable");
        return NULL;
    }
    jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
    jpeg_read_header(&cinfo, TRUE);
    PyObject *result = Py_BuildValue("(iii)", (int)cinfo.image_width, (int)cinfo.image_height, cinfo.num_components);
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* Pillow's antialiased bilinear resampling, exactly (libImaging/Resample.c)                  */

#define PRECISION_BITS (32 - 8 - 2)

static inline unsigned char clip8(int in)
{
    int v = in >> PRECISION_BITS; /* branchless, so loops over it vectorize */
    v = v < 0 ? 0 : v;
    return (unsigned char)(v > 255 ? 255 : v);
}

static double bilinear(double x)
{
    if (x < 0.0)
        x = -x;
    if (x < 1.0)
        return 1.0 - x;
    return 0.0;
}

/* coefficients of one axis: bounds[2*i] = first input pixel, bounds[2*i+1] = count; kk fixed point */
static int coefficients(int in_size, double in0, double in1, int out_size, int **bounds_out, int **kk_out)
{
    double scale = (in1 - in0) / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 1.0 * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    double *pre = malloc(sizeof(double) * (size_t)out_size * ksize);
    int *bounds = malloc(sizeof(int) * (size_t)out_size * 2);
    int *kk = malloc(sizeof(int) * (size_t)out_size * ksize);
    if (!pre || !bounds || !kk) {
        free(pre); free(bounds); free(kk);
        return -1;
    }
    for (int xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5), x;
        if (xmin < 0) xmin = 0;
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double *k = &pre[xx * ksize];
        for (x = 0; x < xmax; x++) {
            double w = bilinear((x + xmin - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        for (x = 0; x < xmax; x++)
            if (ww != 0.0) k[x] /= ww;
        for (; x < ksize; x++) k[x] = 0;
        bounds[xx * 2] = xmin;
        bounds[xx * 2 + 1] = xmax;
    }
    for (int i = 0; i < out_size * ksize; i++)
        kk[i] = pre[i] < 0 ? (int)(-0.5 + pre[i] * (1 << PRECISION_BITS)) : (int)(0.5 + pre[i] * (1 << PRECISION_BITS));
    free(pre);
    *bounds_out = bounds;
    *kk_out = kk;
    return ksize;
}

/* the affine colour map on a row of RGB bytes, as Pillow's convert("RGB", matrix): float, +0.5, clipped */
static void color_row(unsigned char *line, int out_w, const float *color)
{
    for (int x = 0; x < out_w; x++) {
        unsigned char *q = line + x * 3;
        float r = q[0], g = q[1], b = q[2];
        for (int i = 0; i < 3; i++) {
            float v = color[i * 4] * r + color[i * 4 + 1] * g + color[i * 4 + 2] * b + color[i * 4 + 3] + 0.5F;
            q[i] = v <= 0.0F ? 0 : v >= 255.0F ? 255 : (unsigned char)v;
        }
    }
}

/* a row of RGB bytes, flipped or not, through the channels' tables into three float planes
   (`affine`: the tables' (sub, mul) pairs where tables_affine holds, for planes_avx2; else NULL) */
static void planes_portable(const unsigned char *line, int out_w, int flip, const float *table, const float *affine,
                            float *o0, float *o1, float *o2)
{
    (void)affine;
    for (int xx = 0; xx < out_w; xx++) {
        const unsigned char *q = line + (flip ? out_w - 1 - xx : xx) * 3;
        o0[xx] = table[q[0]]; o1[xx] = table[256 + q[1]]; o2[xx] = table[512 + q[2]];
    }
}

typedef void (*planes_fn)(const unsigned char *, int, int, const float *, const float *, float *, float *, float *);
static planes_fn planes = planes_portable;

/* one finished output row (RGB bytes) into `out`: flipped or not, in the layout and dtype of mode */
static void write_row(const unsigned char *line, int out_w, int yy, int flip, int mode, const float *table,
                      const float *affine, void *out, size_t plane)
{
    size_t row0 = (size_t)yy * out_w;
    if (mode == 3) { /* the common training layout: float32 planes */
        float *o0 = (float *)out + row0;
        planes(line, out_w, flip, table, affine, o0, o0 + plane, o0 + 2 * plane);
        return;
    }
    for (int xx = 0; xx < out_w; xx++) {
        const unsigned char *q = line + (flip ? out_w - 1 - xx : xx) * 3;
        size_t at = row0 + xx;
        if (mode == 0) {
            unsigned char *o = (unsigned char *)out + at * 3;
            o[0] = q[0]; o[1] = q[1]; o[2] = q[2];
        } else if (mode == 1) {
            unsigned char *o = (unsigned char *)out;
            o[at] = q[0]; o[plane + at] = q[1]; o[2 * plane + at] = q[2];
        } else {
            float *o = (float *)out + at * 3;
            o[0] = table[q[0]]; o[1] = table[256 + q[1]]; o[2] = table[512 + q[2]];
        }
    }
}

/* The two passes of resample, one row at a time. Each has a portable version and, on x86 with
   AVX2 (checked at run time), one with intrinsics doing the same integer arithmetic lane by lane:
   the outputs are identical (tests/core/test_jpeg_fastpath.py compares them). */

/* horizontal: `rows` rows of out_w RGB pixels (3 bytes each; 4 are written, so `to` needs a spare
   byte after its last row) from as many RGBX source lines, each pixel the weighted sum of its taps */
static void hrows_portable(const unsigned char *in, size_t in_stride, int rows, unsigned char *to, int out_w,
                           const int *bounds, const int *kk, int ksize)
{
    for (int y = 0; y < rows; y++, in += in_stride, to += (size_t)out_w * 3)
        for (int xx = 0; xx < out_w; xx++) {
            int xmax = bounds[xx * 2 + 1];
            const int *k = &kk[xx * ksize];
            int s[4] = {1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1),
                        1 << (PRECISION_BITS - 1)};
            const unsigned char *p = in + (size_t)bounds[xx * 2] * 4;
            for (int x = 0; x < xmax; x++, p += 4)
                for (int c = 0; c < 4; c++)
                    s[c] += p[c] * k[x];
            to[xx * 3] = clip8(s[0]);
            to[xx * 3 + 1] = clip8(s[1]);
            to[xx * 3 + 2] = clip8(s[2]);
            to[xx * 3 + 3] = 0;
        }
}

/* vertical: n bytes of one output row, each the weighted sum of the same byte in `taps` rows */
static void vrow_portable(const unsigned char *first, size_t stride, int taps, const int *k, int n,
                          unsigned char *line, int *acc)
{
    for (int i = 0; i < n; i++)
        acc[i] = 1 << (PRECISION_BITS - 1);
    for (int y = 0; y < taps; y++) {
        const unsigned char *row = first + (size_t)y * stride;
        int kv = k[y];
        for (int i = 0; i < n; i++) /* contiguous: the compiler vectorizes it */
            acc[i] += row[i] * kv;
    }
    for (int i = 0; i < n; i++)
        line[i] = clip8(acc[i]);
}

#ifdef TARPROC_X86
/* Two source lines at once (they share the taps), two taps at a time: eight bytes of each line
   (two RGBX pixels) are spread into 16-bit lanes, R of the first tap beside R of the second, and
   so on, and _mm256_madd_epi16 multiplies them by the pair of coefficients and adds the products:
   the R, G, B, X sums of one output pixel in each line, per 256-bit register. A coefficient has up
   to 23 bits, a 16-bit lane holds 15: each is split into hi * 2^11 + lo (lo in 0..2047), the two
   halves summed apart, and sum = hi_sum * 2^11 + lo_sum is the portable pass's sum exactly. The
   shift, then saturating packs (to int16, then to 0..255), are clip8. */
/* two taps of one output pixel in two lines (a: the first line's two RGBX pixels, b: the
   second's), into the lo and hi sums: see hrows_avx2 */
__attribute__((target("avx2"))) static inline void madd_taps(__m128i a, __m128i b, const uint32_t *w, __m256i *lo,
                                                             __m256i *hi)
{
    const __m256i spread = _mm256_setr_epi8(0, -1, 4, -1, 1, -1, 5, -1, 2, -1, 6, -1, 3, -1, 7, -1,
                                            0, -1, 4, -1, 1, -1, 5, -1, 2, -1, 6, -1, 3, -1, 7, -1);
    __m256i v = _mm256_shuffle_epi8(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1), spread);
    *lo = _mm256_add_epi32(*lo, _mm256_madd_epi16(v, _mm256_set1_epi32((int)w[0])));
    *hi = _mm256_add_epi32(*hi, _mm256_madd_epi16(v, _mm256_set1_epi32((int)w[1])));
}

__attribute__((target("avx2"))) static void hrows_avx2(const unsigned char *in, size_t in_stride, int rows,
                                                       unsigned char *to, int out_w, const int *bounds,
                                                       const int *kk, int ksize)
{
    int pairs = (ksize + 1) / 2;
    uint32_t *pk = malloc(sizeof(uint32_t) * 2 * (size_t)pairs * (size_t)out_w); /* (lo, hi) pair words */
    if (!pk) {
        hrows_portable(in, in_stride, rows, to, out_w, bounds, kk, ksize);
        return;
    }
    for (int xx = 0; xx < out_w; xx++)
        for (int j = 0; j < pairs; j++) {
            const int *k = &kk[xx * ksize];
            int a = k[2 * j], b = 2 * j + 1 < ksize ? k[2 * j + 1] : 0; /* 0 past xmax (coefficients) */
            uint32_t *w = &pk[((size_t)xx * pairs + j) * 2];
            w[0] = ((uint32_t)a & 0x7FF) | (((uint32_t)b & 0x7FF) << 16);
            w[1] = ((uint32_t)(a >> 11) & 0xFFFF) | ((uint32_t)(b >> 11) << 16);
        }
    const __m256i half = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
    size_t to_stride = (size_t)out_w * 3;
    int y = 0;
    for (; y + 2 <= rows; y += 2, in += 2 * in_stride, to += 2 * to_stride)
        for (int xx = 0; xx < out_w; xx++) {
            int xmax = bounds[xx * 2 + 1], x = 0;
            const uint32_t *w = &pk[(size_t)xx * pairs * 2];
            const unsigned char *p0 = in + (size_t)bounds[xx * 2] * 4, *p1 = p0 + in_stride;
            __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
            for (; x + 2 <= xmax; x += 2, w += 2)
                madd_taps(_mm_loadl_epi64((const __m128i *)(p0 + x * 4)),
                          _mm_loadl_epi64((const __m128i *)(p1 + x * 4)), w, &lo, &hi);
            if (x < xmax) { /* an odd tap last: one pixel a line (its pair's coefficient is 0) */
                int v0, v1;
                memcpy(&v0, p0 + x * 4, 4);
                memcpy(&v1, p1 + x * 4, 4);
                madd_taps(_mm_cvtsi32_si128(v0), _mm_cvtsi32_si128(v1), w, &lo, &hi);
            }
            __m256i s = _mm256_add_epi32(_mm256_add_epi32(half, lo), _mm256_slli_epi32(hi, 11));
            s = _mm256_srai_epi32(s, PRECISION_BITS);
            __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            __m128i bytes = _mm_packus_epi16(words, words);
            int rgbx0 = _mm_cvtsi128_si32(bytes), rgbx1 = _mm_extract_epi32(bytes, 1);
            /* four bytes (the next pixel's R is written after); the last pixel of the first line
               would overwrite the second line's first byte: three there */
            size_t width = xx + 1 < out_w ? 4 : 3;
            memcpy(to + xx * 3, &rgbx0, width);
            memcpy(to + to_stride + xx * 3, &rgbx1, width);
        }
    free(pk);
    if (y < rows)
        hrows_portable(in, in_stride, rows - y, to, out_w, bounds, kk, ksize);
}

/* sixteen bytes of the row at a time, in two registers of eight 32-bit sums */
__attribute__((target("avx2"))) static void vrow_avx2(const unsigned char *first, size_t stride, int taps,
                                                      const int *k, int n, unsigned char *line, int *acc)
{
    const __m256i half = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i s0 = half, s1 = half;
        for (int y = 0; y < taps; y++) {
            __m128i b = _mm_loadu_si128((const __m128i *)(first + (size_t)y * stride + i));
            __m256i kv = _mm256_set1_epi32(k[y]);
            s0 = _mm256_add_epi32(s0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(b), kv));
            s1 = _mm256_add_epi32(s1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)), kv));
        }
        s0 = _mm256_srai_epi32(s0, PRECISION_BITS);
        s1 = _mm256_srai_epi32(s1, PRECISION_BITS);
        /* packs work within 128-bit halves: (s0 lo, s1 lo | s0 hi, s1 hi), then put them in order */
        __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(s0, s1), 0xD8);
        __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storeu_si128((__m128i *)(line + i), bytes);
    }
    if (i < n)
        vrow_portable(first + i, stride, taps, k, n - i, line + i, acc);
}

/* planes_portable eight pixels at a time where the tables are affine (tables_affine): their 24
   bytes split into R, G and B lanes (in reverse order when flipped), each made float, less sub,
   times mul -- the arithmetic that made the tables, so the same floats */
__attribute__((target("avx2"))) static void planes_avx2(const unsigned char *line, int out_w, int flip,
                                                        const float *table, const float *affine, float *o0, float *o1,
                                                        float *o2)
{
    if (!affine) {
        planes_portable(line, out_w, flip, table, NULL, o0, o1, o2);
        return;
    }
    /* where lane i of a channel comes from: a byte of the first 16 (lo) or of the last 8 (hi) */
    static const signed char forward[3][2][8] = {{{0, 3, 6, 9, 12, 15, -1, -1}, {-1, -1, -1, -1, -1, -1, 2, 5}},
                                                 {{1, 4, 7, 10, 13, -1, -1, -1}, {-1, -1, -1, -1, -1, 0, 3, 6}},
                                                 {{2, 5, 8, 11, 14, -1, -1, -1}, {-1, -1, -1, -1, -1, 1, 4, 7}}};
    __m128i masks[3][2];
    __m256 sub[3], mul[3];
    for (int c = 0; c < 3; c++) {
        for (int h = 0; h < 2; h++) {
            signed char m[16];
            for (int i = 0; i < 16; i++)
                m[i] = i < 8 ? forward[c][h][flip ? 7 - i : i] : -1;
            masks[c][h] = _mm_loadu_si128((const __m128i *)m);
        }
        sub[c] = _mm256_set1_ps(affine[2 * c]);
        mul[c] = _mm256_set1_ps(affine[2 * c + 1]);
    }
    float *o[3] = {o0, o1, o2};
    int xx = 0;
    for (; xx + 8 <= out_w; xx += 8) {
        const unsigned char *q = line + (size_t)(flip ? out_w - 8 - xx : xx) * 3;
        __m128i lo = _mm_loadu_si128((const __m128i *)q), hi = _mm_loadl_epi64((const __m128i *)(q + 16));
        for (int c = 0; c < 3; c++) {
            __m128i bytes = _mm_or_si128(_mm_shuffle_epi8(lo, masks[c][0]), _mm_shuffle_epi8(hi, masks[c][1]));
            __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
            _mm256_storeu_ps(o[c] + xx, _mm256_mul_ps(_mm256_sub_ps(v, sub[c]), mul[c]));
        }
    }
    if (xx < out_w) { /* the last out_w % 8 pixels: their sources are the first ones when flipped */
        int rest = out_w - xx;
        const unsigned char *q = flip ? line : line + (size_t)xx * 3;
        planes_portable(q, rest, flip, table, NULL, o0 + xx, o1 + xx, o2 + xx);
    }
}
#endif

typedef void (*hrows_fn)(const unsigned char *, size_t, int, unsigned char *, int, const int *, const int *, int);
typedef void (*vrow_fn)(const unsigned char *, size_t, int, const int *, int, unsigned char *, int *);
static hrows_fn hrows = hrows_portable;
static vrow_fn vrow = vrow_portable;
static int simd_available = 0;

static void choose_passes(int simd)
{
    hrows = hrows_portable;
    vrow = vrow_portable;
    planes = planes_portable;
#ifdef TARPROC_X86
    if (simd && simd_available) {
        hrows = hrows_avx2;
        vrow = vrow_avx2;
        planes = planes_avx2;
    }
#else
    (void)simd;
#endif
}

static PyObject *use_own_entropy(PyObject *Py_UNUSED(self), PyObject *args)
{
    int on, pairs = 1;
    if (!PyArg_ParseTuple(args, "p|p", &on, &pairs))
        return NULL;
    own_entropy = on;
    two_at_once = pairs;
    Py_RETURN_NONE;
}

static PyObject *use_simd(PyObject *Py_UNUSED(self), PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    choose_passes(on);
    return PyBool_FromLong(hrows != hrows_portable);
}

static PyObject *resample(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer src, out, tables;
    int width, height, out_w, out_h, flip, mode;
    double box[4];
    PyObject *color_obj;
    if (!PyArg_ParseTuple(args, "y*ii(dddd)iipOy*iw*", &src, &width, &height, &box[0], &box[1], &box[2], &box[3],
                          &out_w, &out_h, &flip, &color_obj, &tables, &mode, &out))
        return NULL;
    PyObject *error = NULL;
    float color[12], table[3 * 256 + 6];
    const float *affine = NULL;
    int have_color = color_obj != Py_None;
    /* the box as Pillow's resize takes it: within the source, x0 <= x1 and y0 <= y1 */
    int box_ok = 1;
    for (int i = 0; i < 4; i++)
        box_ok = box_ok && isfinite(box[i]);
    box_ok = box_ok && box[0] >= 0 && box[1] >= 0 && box[0] <= box[2] && box[1] <= box[3] && box[2] <= width &&
             box[3] <= height;
    if (!side_ok(width, height, "resample", "width and height") ||
        !output_ok("resample", out_w, out_h, mode, &out, &tables, table, &affine) ||
        (have_color && read_floats(color_obj, 12, color, "resample", "color") < 0)) {
        error = PyExc_ValueError; /* set already */
    } else if ((size_t)src.len < (size_t)width * (size_t)height * 4) {
        PyErr_Format(PyExc_ValueError, "resample: src holds %zd bytes, a %d x %d RGBX image needs %zu", src.len,
                     width, height, (size_t)width * (size_t)height * 4);
        error = PyExc_ValueError;
    } else if (!box_ok) {
        PyErr_Format(PyExc_ValueError, "resample: box must be finite, with 0 <= x0 <= x1 <= width (%d) and "
                     "0 <= y0 <= y1 <= height (%d)", width, height);
        error = PyExc_ValueError;
    }
    int *hb = NULL, *hk = NULL, *vb = NULL, *vk = NULL;
    unsigned char *temp = NULL;
    int hsize = 0, vsize = 0, failed = 0;
    if (!error) {
        hsize = coefficients(width, box[0], box[2], out_w, &hb, &hk);
        vsize = coefficients(height, box[1], box[3], out_h, &vb, &vk);
        if (hsize < 0 || vsize < 0)
            error = PyExc_MemoryError;
    }
    if (!error) {
        int first = vb[0], last = vb[out_h * 2 - 2] + vb[out_h * 2 - 1], rows = last - first;
        int need_h = out_w != width || box[0] != 0 || box[2] != out_w;
        int need_v = out_h != height || box[1] != 0 || box[3] != out_h;
        const unsigned char *in = (const unsigned char *)src.buf;
        Py_BEGIN_ALLOW_THREADS
        /* horizontal pass into rows [first, last) of a temporary RGB image (Pillow skips it when
           the window spans the width unscaled; then the vertical pass reads the source itself) */
        const unsigned char *vin = in;
        int vstride = width * 4, vpixel = 4, voffset = 0;
        if (need_h) {
            temp = malloc((size_t)out_w * 3 * (rows > 0 ? rows : 1) + 1); /* + the spare byte */
            if (temp) {
                hrows(in + (size_t)first * width * 4, (size_t)width * 4, rows, temp, out_w, hb, hk, hsize);
                vin = temp;
                vstride = out_w * 3;
                vpixel = 3;
                voffset = first;
            }
        }
        int *acc = malloc(sizeof(int) * (size_t)out_w * 3);
        unsigned char *line = malloc((size_t)out_w * 3);
        if ((!need_h || temp) && acc && line) {
            size_t plane = (size_t)out_w * out_h;
            int n = out_w * 3;
            for (int yy = 0; yy < out_h; yy++) {
                int ymin = vb[yy * 2] - voffset, ymax = vb[yy * 2 + 1];
                const int *k = &vk[yy * vsize];
                /* vertical pass, one output row at a time */
                if (need_v && vpixel == 3) {
                    vrow(vin + (size_t)ymin * vstride, vstride, ymax, k, n, line, acc);
                } else if (need_v) {
                    for (int xx = 0; xx < out_w; xx++) {
                        int s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
                        for (int y = 0; y < ymax; y++) {
                            const unsigned char *p = vin + (size_t)(y + ymin) * vstride + xx * 4;
                            s0 += p[0] * k[y];
                            s1 += p[1] * k[y];
                            s2 += p[2] * k[y];
                        }
                        line[xx * 3] = clip8(s0); line[xx * 3 + 1] = clip8(s1); line[xx * 3 + 2] = clip8(s2);
                    }
                } else {
                    const unsigned char *row = vin + (size_t)ymin * vstride;
                    for (int xx = 0; xx < out_w; xx++) {
                        line[xx * 3] = row[xx * vpixel]; line[xx * 3 + 1] = row[xx * vpixel + 1];
                        line[xx * 3 + 2] = row[xx * vpixel + 2];
                    }
                }
                if (have_color)
                    color_row(line, out_w, color);
                write_row(line, out_w, yy, flip, mode, table, affine, out.buf, plane);
            }
        }
        failed = !acc || !line;
        free(acc);
        free(line);
        Py_END_ALLOW_THREADS
        if ((need_h && !temp) || failed)
            error = PyExc_MemoryError;
    }
    free(temp); free(hb); free(hk); free(vb); free(vk);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    PyBuffer_Release(&tables);
    if (error) {
        if (!PyErr_Occurred()) /* the arguments were checked: only an allocation can have failed */
            PyErr_NoMemory();
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------ */
/* an affine warp with bilinear sampling, as Pillow's transform(AFFINE, BILINEAR) samples        */

/* One output row of the warp, as RGB bytes in `line` (with a spare byte after it), the affine
   colour map applied when `color` is not NULL. Single-precision arithmetic in a fixed order, so
   that the AVX2 version, lane by lane, gives the same bytes; it differs from Pillow's double
   precision by at most a level, and rarely. `mf` is the matrix (a, b, c, d, e, f) in floats. */
static void warp_pixels_portable(const unsigned char *in, int width, int height, const float *mf, int y, int x0,
                                 int x1, unsigned char *line, const float *color)
{
    float fy = (float)y + 0.5F, fw = (float)width, fh = (float)height;
    for (int x = x0; x < x1; x++) {
        float fx = (float)x + 0.5F;
        float xin = mf[0] * fx + mf[1] * fy + mf[2];
        float yin = mf[3] * fx + mf[4] * fy + mf[5];
        unsigned char *q = line + x * 3;
        if (!(xin >= 0.0F && xin < fw && yin >= 0.0F && yin < fh)) {
            q[0] = q[1] = q[2] = 0; /* outside the image: black */
        } else {
            float xs = xin - 0.5F, ys = yin - 0.5F, xf = floorf(xs), yf = floorf(ys);
            float dx = xs - xf, dy = ys - yf;
            int xi = (int)xf, yi = (int)yf;
            int xa = xi < 0 ? 0 : xi, xb = xi + 1 > width - 1 ? width - 1 : xi + 1;
            int ya = yi < 0 ? 0 : yi, yb = yi + 1 > height - 1 ? height - 1 : yi + 1;
            const unsigned char *r0 = in + (size_t)ya * width * 3, *r1 = in + (size_t)yb * width * 3;
            for (int c = 0; c < 3; c++) {
                float a0 = r0[xa * 3 + c], b0 = r0[xb * 3 + c], a1 = r1[xa * 3 + c], b1 = r1[xb * 3 + c];
                float v1 = a0 + (b0 - a0) * dx, v2 = a1 + (b1 - a1) * dx, v = v1 + (v2 - v1) * dy;
                q[c] = (unsigned char)(v < 0.0F ? 0 : v > 255.0F ? 255 : (int)v);
            }
        }
        if (color) {
            float r = q[0], g = q[1], b = q[2];
            for (int i = 0; i < 3; i++) {
                float v = color[i * 4] * r + color[i * 4 + 1] * g + color[i * 4 + 2] * b + color[i * 4 + 3] + 0.5F;
                q[i] = v <= 0.0F ? 0 : v >= 255.0F ? 255 : (unsigned char)v;
            }
        }
    }
}

#ifdef TARPROC_X86
/* eight output pixels at a time: coordinates, taps (gathered as 32-bit words at 3-byte pixel
   offsets: `in` needs a spare byte after its last pixel), interpolation and colour map in float
   lanes, the same operations in the same order as warp_pixels_portable */
__attribute__((target("avx2"))) static void warp_pixels_avx2(const unsigned char *in, int width, int height,
                                                             const float *mf, int y, int x0, int x1,
                                                             unsigned char *line, const float *color)
{
    const __m256 half = _mm256_set1_ps(0.5F), zero = _mm256_setzero_ps(), top = _mm256_set1_ps(255.0F);
    const __m256 fw = _mm256_set1_ps((float)width), fh = _mm256_set1_ps((float)height);
    const __m256i wmax = _mm256_set1_epi32(width - 1), hmax = _mm256_set1_epi32(height - 1), izero = _mm256_setzero_si256();
    const __m256i stride = _mm256_set1_epi32(width * 3), three = _mm256_set1_epi32(3), byte = _mm256_set1_epi32(255);
    const __m256 fy = _mm256_set1_ps((float)y + 0.5F);
    const __m256 m0 = _mm256_set1_ps(mf[0]), m1 = _mm256_set1_ps(mf[1]), m2 = _mm256_set1_ps(mf[2]);
    const __m256 m3 = _mm256_set1_ps(mf[3]), m4 = _mm256_set1_ps(mf[4]), m5 = _mm256_set1_ps(mf[5]);
    const __m256 lanes = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    int x = x0;
    for (; x + 8 <= x1; x += 8) {
        __m256 fx = _mm256_add_ps(_mm256_add_ps(_mm256_set1_ps((float)x), lanes), half);
        __m256 xin = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(m0, fx), _mm256_mul_ps(m1, fy)), m2);
        __m256 yin = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(m3, fx), _mm256_mul_ps(m4, fy)), m5);
        __m256 inside = _mm256_and_ps(_mm256_and_ps(_mm256_cmp_ps(xin, zero, _CMP_GE_OQ), _mm256_cmp_ps(xin, fw, _CMP_LT_OQ)),
                                      _mm256_and_ps(_mm256_cmp_ps(yin, zero, _CMP_GE_OQ), _mm256_cmp_ps(yin, fh, _CMP_LT_OQ)));
        __m256 xs = _mm256_sub_ps(xin, half), ys = _mm256_sub_ps(yin, half);
        /* lanes outside are masked below; keep their coordinates finite and small for the gathers */
        xs = _mm256_and_ps(xs, inside);
        ys = _mm256_and_ps(ys, inside);
        __m256 xf = _mm256_floor_ps(xs), yf = _mm256_floor_ps(ys);
        __m256 dx = _mm256_sub_ps(xs, xf), dy = _mm256_sub_ps(ys, yf);
        __m256i xi = _mm256_cvttps_epi32(xf), yi = _mm256_cvttps_epi32(yf);
        __m256i one = _mm256_set1_epi32(1);
        __m256i xa = _mm256_max_epi32(xi, izero), xb = _mm256_min_epi32(_mm256_add_epi32(xi, one), wmax);
        __m256i ya = _mm256_max_epi32(yi, izero), yb = _mm256_min_epi32(_mm256_add_epi32(yi, one), hmax);
        xa = _mm256_min_epi32(xa, wmax);
        ya = _mm256_min_epi32(ya, hmax);
        xb = _mm256_max_epi32(xb, izero);
        yb = _mm256_max_epi32(yb, izero);
        __m256i ra = _mm256_mullo_epi32(ya, stride), rb = _mm256_mullo_epi32(yb, stride);
        __m256i ca = _mm256_mullo_epi32(xa, three), cb = _mm256_mullo_epi32(xb, three);
        __m256i pa0 = _mm256_i32gather_epi32((const int *)in, _mm256_add_epi32(ra, ca), 1);
        __m256i pb0 = _mm256_i32gather_epi32((const int *)in, _mm256_add_epi32(ra, cb), 1);
        __m256i pa1 = _mm256_i32gather_epi32((const int *)in, _mm256_add_epi32(rb, ca), 1);
        __m256i pb1 = _mm256_i32gather_epi32((const int *)in, _mm256_add_epi32(rb, cb), 1);
        __m256i ch[3];
        for (int c = 0; c < 3; c++) {
            __m256 a0 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(pa0, 8 * c), byte));
            __m256 b0 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(pb0, 8 * c), byte));
            __m256 a1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(pa1, 8 * c), byte));
            __m256 b1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(pb1, 8 * c), byte));
            __m256 v1 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_sub_ps(b0, a0), dx));
            __m256 v2 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_sub_ps(b1, a1), dx));
            __m256 v = _mm256_add_ps(v1, _mm256_mul_ps(_mm256_sub_ps(v2, v1), dy));
            v = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(v, zero), top), inside); /* black outside */
            ch[c] = _mm256_cvttps_epi32(v);
        }
        if (color) {
            __m256 r = _mm256_cvtepi32_ps(ch[0]), g = _mm256_cvtepi32_ps(ch[1]), b = _mm256_cvtepi32_ps(ch[2]);
            for (int i = 0; i < 3; i++) {
                __m256 v = _mm256_mul_ps(_mm256_set1_ps(color[i * 4]), r);
                v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_set1_ps(color[i * 4 + 1]), g));
                v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_set1_ps(color[i * 4 + 2]), b));
                v = _mm256_add_ps(v, _mm256_set1_ps(color[i * 4 + 3]));
                v = _mm256_add_ps(v, half);
                ch[i] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(v, zero), top));
            }
        }
        __m256i rgb = _mm256_or_si256(ch[0], _mm256_or_si256(_mm256_slli_epi32(ch[1], 8), _mm256_slli_epi32(ch[2], 16)));
        unsigned int pixels[8];
        _mm256_storeu_si256((__m256i *)pixels, rgb);
        for (int k = 0; k < 8; k++) /* four bytes each, the next pixel overwriting the fourth */
            memcpy(line + (x + k) * 3, &pixels[k], 4);
    }
    if (x < x1)
        warp_pixels_portable(in, width, height, mf, y, x, x1, line, color);
}
#endif

typedef void (*warp_fn)(const unsigned char *, int, int, const float *, int, int, int, unsigned char *, const float *);

static PyObject *warp(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer src, out, tables;
    int width, height, out_w, out_h, flip, mode;
    double m[6];
    PyObject *color_obj;
    if (!PyArg_ParseTuple(args, "y*ii(dddddd)iipOy*iw*", &src, &width, &height, &m[0], &m[1], &m[2], &m[3], &m[4],
                          &m[5], &out_w, &out_h, &flip, &color_obj, &tables, &mode, &out))
        return NULL;
    float color[12], table[3 * 256 + 6], mf[6];
    const float *affine = NULL;
    int have_color = color_obj != Py_None, matrix_ok = 1;
    for (int i = 0; i < 6; i++)
        matrix_ok = matrix_ok && finite_float(m[i]);
    int ok = side_ok(width, height, "warp", "width and height") &&
             output_ok("warp", out_w, out_h, mode, &out, &tables, table, &affine) &&
             !(have_color && read_floats(color_obj, 12, color, "warp", "color") < 0);
    if (ok && (size_t)src.len < (size_t)width * (size_t)height * 3) {
        PyErr_Format(PyExc_ValueError, "warp: src holds %zd bytes, a %d x %d RGB image needs %zu", src.len, width,
                     height, (size_t)width * (size_t)height * 3);
        ok = 0;
    }
    if (ok && !matrix_ok) {
        PyErr_SetString(PyExc_ValueError, "warp: matrix must be 6 finite numbers (within float32's range)");
        ok = 0;
    }
    if (!ok) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        PyBuffer_Release(&tables);
        return NULL;
    }
    const unsigned char *in = (const unsigned char *)src.buf;
    size_t plane = (size_t)out_w * out_h;
    for (int i = 0; i < 6; i++)
        mf[i] = (float)m[i];
    /* the gathers read a 32-bit word at each pixel: a spare byte after the last one is needed, and
       their offsets (row * width * 3 + column * 3) are 32-bit ints */
    warp_fn pixels = warp_pixels_portable;
#ifdef TARPROC_X86
    size_t in_bytes = (size_t)width * (size_t)height * 3;
    if (hrows != hrows_portable && (size_t)src.len > in_bytes && in_bytes <= (size_t)INT_MAX)
        pixels = warp_pixels_avx2;
#endif
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    unsigned char *line = malloc((size_t)out_w * 3 + 1);
    for (int y = 0; line && y < out_h; y++) {
        pixels(in, width, height, mf, y, 0, out_w, line, have_color ? color : NULL);
        write_row(line, out_w, y, flip, mode, table, affine, out.buf, plane);
    }
    failed = line == NULL;
    free(line);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    PyBuffer_Release(&tables);
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS, "Decode the rows and columns of a JPEG that a crop needs (RGBX)."},
    {"relayout", relayout, METH_VARARGS, "relayout(data, interval=0, optimize=False) -> the JPEG with restart markers (bytes), or why not (str)."},
    {"read_header", read_header, METH_O, "read_header(data) -> (width, height, components), or ValueError in libjpeg's words."},
    {"resample", resample, METH_VARARGS, "Pillow's antialiased bilinear resize of a window, fused with colour, flip and lookup."},
    {"use_own_entropy", use_own_entropy, METH_VARARGS, "use_own_entropy(flag, two_at_once=True): decode_region's Huffman decoding by tarproc (True; restart segments two at a time, or not) or libjpeg (for tests)."},
    {"use_simd", use_simd, METH_O, "use_simd(flag) -> whether resample now runs its AVX2 passes (for tests)."},
    {"warp", warp, METH_VARARGS, "An affine warp with bilinear sampling (black outside), fused with colour, flip and lookup."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__jpeg(void)
{
#ifdef TARPROC_X86
    __builtin_cpu_init();
    simd_available = __builtin_cpu_supports("avx2");
#endif
    choose_passes(1);
    if (PyType_Ready(&PixelsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObjectRef(m, "Pixels", (PyObject *)&PixelsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
