/*
 * Byte helpers of the compiled core: CRC-32C (Castagnoli), Kafka's murmur2, and
 * little-endian loads and stores.
 *
 * CRC-32C uses the SSE4.2 crc32 instruction when the CPU has it (checked once at run
 * time, so one build runs on any x86-64) and a slicing-by-8 table otherwise. Both give
 * the values of the `crc32c` package: crc32c(data, value) continues a CRC, so
 * crc32c(b, crc32c(a)) == crc32c(a + b).
 */
#ifndef EVENTSPOOL_BYTES_UTIL_H
#define EVENTSPOOL_BYTES_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "eventspool's compiled core writes the little-endian queue format with native stores"
#endif

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

static uint32_t es_crc_table[8][256];
static uint32_t es_crc32_ieee_table[256];
static int es_crc_hardware = 0;

static void es_crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        }
        es_crc_table[0][n] = c;
        c = n;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        }
        es_crc32_ieee_table[n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = es_crc_table[0][n];
        for (int t = 1; t < 8; t++) {
            c = es_crc_table[0][c & 0xff] ^ (c >> 8);
            es_crc_table[t][n] = c;
        }
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    es_crc_hardware = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
}

static uint32_t es_crc32c_portable(uint32_t crc, const void *data, size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = es_crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = es_crc_table[7][w & 0xff] ^ es_crc_table[6][(w >> 8) & 0xff] ^
              es_crc_table[5][(w >> 16) & 0xff] ^ es_crc_table[4][(w >> 24) & 0xff] ^
              es_crc_table[3][(w >> 32) & 0xff] ^ es_crc_table[2][(w >> 40) & 0xff] ^
              es_crc_table[1][(w >> 48) & 0xff] ^ es_crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) {
        crc = es_crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    }
    return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t es_crc32c_sse42(uint32_t crc, const void *data,
                                                                   size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    uint64_t c = (uint32_t)~crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    while (n--) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
    }
    return ~(uint32_t)c;
}
#endif

static inline uint32_t es_crc32c(uint32_t crc, const void *data, size_t n) {
#if defined(__x86_64__)
    if (es_crc_hardware) {
        return es_crc32c_sse42(crc, data, n);
    }
#endif
    return es_crc32c_portable(crc, data, n);
}

/* zlib's crc32 (IEEE polynomial), for the consumer's key routing; keys are short. */
static inline uint32_t es_crc32_ieee(const void *data, size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    uint32_t crc = 0xFFFFFFFFu;
    while (n--) {
        crc = es_crc32_ieee_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    }
    return ~crc;
}

/* Kafka's Utils.murmur2 (seed 0x9747b28c), as the signed Java int. */
static inline int32_t es_murmur2(const void *data, size_t length) {
    const uint8_t *p = (const uint8_t *)data;
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    size_t blocks = length >> 2;
    for (size_t i = 0; i < blocks; i++) {
        uint32_t k;
        memcpy(&k, p + 4 * i, 4);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    const uint8_t *tail = p + 4 * blocks;
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)tail[2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)tail[1] << 8;
        /* fall through */
    case 1:
        h ^= tail[0];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)h;
}

static inline void es_put_u16(char *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void es_put_u32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void es_put_u64(char *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint16_t es_get_u16(const char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t es_get_u32(const char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t es_get_u64(const char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* The agent's wire protocol is big endian, as Kafka's is. */
static inline void es_put_be16(char *p, uint16_t v) { v = __builtin_bswap16(v); memcpy(p, &v, 2); }
static inline void es_put_be32(char *p, uint32_t v) { v = __builtin_bswap32(v); memcpy(p, &v, 4); }
static inline uint16_t es_get_be16(const char *p) { uint16_t v; memcpy(&v, p, 2); return __builtin_bswap16(v); }
static inline uint32_t es_get_be32(const char *p) { uint32_t v; memcpy(&v, p, 4); return __builtin_bswap32(v); }

/* The commit of a record: its length word, stored after everything it covers. */
static inline void es_publish_u32(char *p, uint32_t v) {
    __atomic_store_n((uint32_t *)p, v, __ATOMIC_RELEASE);
}

/* A position shared between processes: what was read before the store is done with. */
static inline void es_store_release_u64(uint64_t *p, uint64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline uint64_t es_load_acquire_u64(const uint64_t *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

#endif
