/* test_word.c - the fences' word's comparison (shim/engine/fence.h), on the
 * engine's own function: numbers are 32 bits and compared modulo 2^32, so
 * that a long run's numbers wrap without handing out a block early. A
 * number reads as passed when the word is at it or up to 2^31 past it;
 * anything else says nothing (the reuse asks the fence's event). A plain
 * unsigned comparison would read every number given before a wrap as
 * passed by no write at all, or none after it. */
#include <criterion/criterion.h>

#include <string.h>

#include "contexts.h"
#include "fence.h"

static struct cd_ctx ctx;
static _Atomic uint32_t word;

static bool passed(uint32_t seen, uint32_t number)
{
    memset(&ctx, 0, sizeof ctx);
    atomic_store(&word, seen);
    ctx.word = &word;
    return cd_fence_word_passed(&ctx, number);
}

Test(word, at_or_before_the_word_passed)
{
    cr_expect(passed(100, 100));
    cr_expect(passed(100, 1));
    cr_expect_not(passed(100, 101));
    cr_expect_not(passed(100, 5000));
}

Test(word, across_the_wrap)
{
    /* The last write before the wrap, and the first numbers after it. */
    cr_expect(passed(0xfffffff0u, 0xffffffe0u));
    cr_expect_not(passed(0xfffffff0u, 0xfffffff1u));
    cr_expect_not(passed(0xfffffff0u, 1), "a number given after the wrap, before its write");
    /* The first write after it covers the numbers on both sides. */
    cr_expect(passed(5, 0xfffffff8u));
    cr_expect(passed(5, 1));
    cr_expect(passed(5, 5));
    cr_expect_not(passed(5, 6));
}

Test(word, half_the_range_behind_is_not_passed)
{
    cr_expect(passed(0x80000000u, 1), "2^31 - 1 behind the word");
    cr_expect_not(passed(0x80000001u, 1), "2^31 behind: too old to tell");
}

Test(word, no_number_and_no_word_say_nothing)
{
    cr_expect_not(passed(0, 0), "0 is no number");
    cr_expect_not(passed(7, 0));
    memset(&ctx, 0, sizeof ctx);
    cr_expect_not(cd_fence_word_passed(&ctx, 1), "a context without its word");
}
