/* xl_avx.c - AVX2 and AVX-512 instructions run translated (tests/tests/translate.rs):
 * `xl_avx avx2` and `xl_avx avx512` compute a checksum of a constant table (RIP-relative
 * loads) with 256-bit and 512-bit (EVEX, mask registers) integer arithmetic. Where the CPU lacks
 * them, the program dies of SIGILL, natively and translated alike. */
#include <immintrin.h>
#include <stdio.h>
#include <string.h>

static const int xl_table[64] = {
    3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5,
    0, 2, 8, 8, 4, 1, 9, 7, 1, 6, 9, 3, 9, 9, 3, 7, 5, 1, 0, 5, 8, 2, 0, 9, 7, 4, 9, 4, 4, 5, 9, 2,
};

__attribute__((noinline, target("avx2"))) long xl_avx2_sum(int rounds)
{
    __m256i acc = _mm256_setzero_si256();
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < 64; i += 8) {
            __m256i v = _mm256_loadu_si256((const __m256i *)&xl_table[i]);
            acc = _mm256_add_epi32(_mm256_mullo_epi32(acc, _mm256_set1_epi32(3)), v);
            acc = _mm256_xor_si256(acc, _mm256_srli_epi32(acc, 7));
        }
    int out[8];
    _mm256_storeu_si256((__m256i *)out, acc);
    long s = 0;
    for (int i = 0; i < 8; i++)
        s = s * 31 + out[i];
    return s;
}

__attribute__((noinline, target("avx512f"))) long xl_avx512_sum(int rounds)
{
    __m512i acc = _mm512_setzero_si512();
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < 64; i += 16) {
            __m512i v = _mm512_loadu_si512((const void *)&xl_table[i]);
            __mmask16 odd = _mm512_test_epi32_mask(v, _mm512_set1_epi32(1));
            acc = _mm512_mask_add_epi32(_mm512_mullo_epi32(acc, _mm512_set1_epi32(5)), odd, acc, v);
            acc = _mm512_xor_si512(acc, _mm512_srli_epi32(acc, 9));
        }
    int out[16];
    _mm512_storeu_si512((void *)out, acc);
    long s = 0;
    for (int i = 0; i < 16; i++)
        s = s * 31 + out[i];
    return s;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    if (strcmp(argv[1], "avx2") == 0)
        printf("xl_avx avx2: %ld\n", xl_avx2_sum(100));
    else if (strcmp(argv[1], "avx512") == 0)
        printf("xl_avx avx512: %ld\n", xl_avx512_sum(100));
    else
        return 2;
    return 0;
}
