/**
 * The command a mistyped word was probably meant to be: `runlock stauts x`
 * asks "did you mean 'status'?".
 *
 * @module
 */

/**
 * The optimal string alignment distance (Damerau-Levenshtein): `stauts` is
 * one swap from `status`. d[i][j]: from a's first i to b's first j.
 */
function editDistance(a: string, b: string): number {
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
 * The one name nearest to `word` (case ignored), if at most 2 edits away;
 * else undefined, rather than a guess.
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
