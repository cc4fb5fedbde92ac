/**
 * The command a mistyped word was probably meant to be: `runlock stauts x`
 * asks "did you mean 'status'?".
 *
 * @module
 */

/**
 * The edit distance between `a` and `b`, counting an insertion, a
 * deletion, a substitution or a swap of two adjacent characters as one
 * edit (Damerau-Levenshtein, as optimal string alignment: `stauts` is one
 * swap from `status`). Compares UTF-16 code units, which is enough for
 * command names.
 *
 * @param a One word.
 * @param b The other.
 * @returns The number of edits that turn `a` into `b`.
 */
export function editDistance(a: string, b: string): number {
  // d[i][j]: the distance between the first i characters of a and the
  // first j of b.
  const d: number[][] = Array.from(
    { length: a.length + 1 },
    (_, i) => Array.from({ length: b.length + 1 }, (_, j) => i === 0 ? j : i),
  );
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      d[i][j] = Math.min(
        d[i - 1][j] + 1,
        d[i][j - 1] + 1,
        d[i - 1][j - 1] + cost,
      );
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) {
        d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.length][b.length];
}

/**
 * The name among `names` nearest to `word`, if it is at most 2 edits away
 * ({@linkcode editDistance}, case ignored) and no other name is as near;
 * else undefined, rather than a guess.
 *
 * @param word What was typed.
 * @param names The words it may have meant.
 * @returns The one nearest name, or undefined.
 */
export function nearest(
  word: string,
  names: readonly string[],
): string | undefined {
  let best: string | undefined;
  let bestDistance = 3;
  let tie = false;
  for (const name of names) {
    const distance = editDistance(word.toLowerCase(), name);
    if (distance < bestDistance) {
      best = name;
      bestDistance = distance;
      tie = false;
    } else if (distance === bestDistance) {
      tie = true;
    }
  }
  // A word of one or two characters is two edits from every short name:
  // no suggestion is better than an arbitrary one.
  if (tie || best === undefined || bestDistance >= word.length) {
    return undefined;
  }
  return best;
}
