/**
 * How wide a text shows on a terminal, and how to cut it to a width
 * without breaking a character: what the live table of `ls --watch` needs
 * on a narrow window.
 *
 * A text is measured and cut by grapheme clusters (a letter and its
 * combining marks, a surrogate pair, an emoji sequence): a cut never falls
 * inside one. A cluster is as wide as wcwidth(3) counts its first code
 * point: 2 for East Asian Wide and Fullwidth characters (CJK, Hangul,
 * kana, fullwidth forms) and emoji shown as emoji, 0 for a cluster of
 * combining marks alone, 1 otherwise.
 *
 * @module
 */

/** The cut text's mark: one column, "…" (U+2026). */
const ELLIPSIS = "…";

/**
 * The code points two columns wide: East Asian Wide (W) and Fullwidth (F),
 * as Markus Kuhn's wcwidth() lists them; emoji are counted by their
 * Emoji_Presentation property instead (see wide()).
 */
const WIDE: readonly [number, number][] = [
  [0x1100, 0x115f], // Hangul Jamo initial consonants
  [0x2329, 0x232a], // angle brackets
  [0x2e80, 0x303e], // CJK radicals, Kangxi, CJK symbols and punctuation
  [0x3041, 0x33ff], // kana, Bopomofo, Hangul compatibility Jamo, CJK ...
  [0x3400, 0x4dbf], // CJK Unified Ideographs Extension A
  [0x4e00, 0x9fff], // CJK Unified Ideographs
  [0xa000, 0xa4cf], // Yi
  [0xac00, 0xd7a3], // Hangul syllables
  [0xf900, 0xfaff], // CJK Compatibility Ideographs
  [0xfe10, 0xfe19], // vertical forms
  [0xfe30, 0xfe6f], // CJK compatibility forms, small form variants
  [0xff00, 0xff60], // fullwidth forms
  [0xffe0, 0xffe6], // fullwidth signs
  [0x20000, 0x2fffd], // CJK Extensions B to F, compatibility supplement
  [0x30000, 0x3fffd], // CJK Extension G and after
];

/** Emoji that a terminal shows as emoji, two columns wide. */
const EMOJI = /^\p{Emoji_Presentation}/u;
/** A cluster of combining marks alone (at the start of a text). */
const MARKS = /^\p{M}+$/u;
/** A cluster asked to show as an emoji (VARIATION SELECTOR-16). */
const AS_EMOJI = "\ufe0f";

/** Whether code point `code` is East Asian Wide or Fullwidth. */
function wide(code: number): boolean {
  for (const [from, to] of WIDE) {
    if (code < from) return false;
    if (code <= to) return true;
  }
  return false;
}

/** One grapheme cluster's width in columns: 0, 1 or 2. */
function clusterWidth(cluster: string): number {
  const code = cluster.codePointAt(0) ?? 0;
  if (wide(code) || EMOJI.test(cluster)) return 2;
  if (cluster.includes(AS_EMOJI) && /^\p{Emoji}/u.test(cluster)) return 2;
  if (MARKS.test(cluster)) return 0;
  return 1;
}

const segmenter = typeof Intl.Segmenter === "function"
  ? new Intl.Segmenter(undefined, { granularity: "grapheme" })
  : undefined;

/**
 * `text`'s grapheme clusters: by Intl.Segmenter, or (a runtime without
 * it) each code point with the combining marks that follow it.
 */
function clusters(text: string): string[] {
  if (segmenter) return [...segmenter.segment(text)].map((s) => s.segment);
  return text.match(/\P{M}\p{M}*|\p{M}+/gsu) ?? [];
}

/**
 * How many columns `text` takes on a terminal (wide characters two, a
 * combining mark none). `text` holds no control character: a text from
 * {@linkcode printable} of `./_format.ts`.
 *
 * @param text A printable text.
 * @returns Its width in columns.
 *
 * @example Wide characters count two (the doc test imports `width`
 * itself)
 * ```ts
 * import assert from "node:assert/strict";
 *
 * assert.equal(width("run.lock"), 8);
 * assert.equal(width("日本.lock"), 9);
 * assert.equal(width("e\u0301"), 1);
 * ```
 */
export function width(text: string): number {
  // The common case, without segmenting: printable ASCII, one column each.
  if (/^[\x20-\x7e]*$/.test(text)) return text.length;
  let sum = 0;
  for (const cluster of clusters(text)) sum += clusterWidth(cluster);
  return sum;
}

/**
 * `text` cut to at most `max` columns, keeping its start: whole grapheme
 * clusters, then "…" (one column) if anything was cut. A wide character
 * that would straddle the edge goes whole, so the result may be a column
 * narrower than `max`.
 *
 * @param text A printable text.
 * @param max The columns it may take; 0 or less gives "".
 * @returns `text` itself if it fits, else its start and "…".
 *
 * @example Cut at the end, never inside a character
 * ```ts
 * import assert from "node:assert/strict";
 *
 * assert.equal(cutEnd("sleep 120", 6), "sleep…");
 * assert.equal(cutEnd("日本語.lock", 6), "日本…");
 * assert.equal(cutEnd("short", 9), "short");
 * ```
 */
export function cutEnd(text: string, max: number): string {
  if (width(text) <= max) return text;
  if (max < 1) return "";
  let kept = "";
  let used = 0;
  for (const cluster of clusters(text)) {
    const w = clusterWidth(cluster);
    if (used + w > max - 1) break;
    kept += cluster;
    used += w;
  }
  return kept + ELLIPSIS;
}

/**
 * `text` cut to at most `max` columns, keeping its end: "…" (one column)
 * if anything was cut, then whole grapheme clusters. For a path, whose
 * end names the lock: "…/state/run.lock". A wide character that would
 * straddle the edge goes whole, so the result may be a column narrower
 * than `max`.
 *
 * @param text A printable text.
 * @param max The columns it may take; 0 or less gives "".
 * @returns `text` itself if it fits, else "…" and its end.
 *
 * @example Cut at the start, keeping the file name
 * ```ts
 * import assert from "node:assert/strict";
 *
 * assert.equal(cutStart("/srv/app/state/run.lock", 16), "…/state/run.lock");
 * assert.equal(cutStart("/srv/日本語.lock", 8), "…語.lock");
 * ```
 */
export function cutStart(text: string, max: number): string {
  if (width(text) <= max) return text;
  if (max < 1) return "";
  const all = clusters(text);
  let kept = "";
  let used = 0;
  for (let i = all.length - 1; i >= 0; i--) {
    const w = clusterWidth(all[i]);
    if (used + w > max - 1) break;
    kept = all[i] + kept;
    used += w;
  }
  return ELLIPSIS + kept;
}

/**
 * `text` broken into lines of at most `max` columns where it has spaces,
 * as runlock's messages are printed on a terminal. Each line of `text` is
 * broken on its own; the lines a break makes start with that line's own
 * indent and two spaces more, so they read as its continuation. What is
 * meant to be copied is never broken: a line indented by two spaces or
 * more (a command, SQL), and a quoted span (`'…'`, `"…"`, or a command in
 * backquotes; SQL's `""` and a backslash escape close nothing, a `'` after
 * a letter opens nothing, one before a letter closes nothing: "it's",
 * "users'"). A word wider than `max` goes whole on a line of its own.
 *
 * @param text A printable text, lines separated by "\n".
 * @param max The columns a line may take.
 * @returns `text`, each line that was wider than `max` broken.
 *
 * @example A long message in two lines
 * ```ts
 * import assert from "node:assert/strict";
 *
 * assert.equal(
 *   wrap("runlock: cannot run 'my tool': not found", 24),
 *   "runlock: cannot run\n  'my tool': not found",
 * );
 * assert.equal(wrap("  SELECT 1 FROM a_long_table_name", 10), "  SELECT 1 FROM a_long_table_name");
 * ```
 */
export function wrap(text: string, max: number): string {
  return text.split("\n").map((line) => wrapLine(line, max)).join("\n");
}

/** One line of {@linkcode wrap}. */
function wrapLine(line: string, max: number): string {
  if (width(line) <= max || line.startsWith("  ")) return line;
  const indent = line.startsWith(" ") ? " " : "";
  const more = indent + "  ";
  const lines: string[] = [];
  let current = indent;
  let fresh = true;
  for (const word of words(line.slice(indent.length))) {
    if (fresh) {
      current += word;
      fresh = false;
    } else if (width(current) + 1 + width(word) <= max) {
      current += " " + word;
    } else {
      lines.push(current);
      current = more + word;
    }
  }
  lines.push(current);
  return lines.join("\n");
}

/** Whether `c` is a letter or a digit (of any script). */
const isWordChar = (c: string | undefined) =>
  c !== undefined && /[\p{L}\p{N}]/u.test(c);

/**
 * The words of `line`, split at the spaces outside quoted spans (see
 * {@linkcode wrap}). A quote never closed quotes nothing.
 */
function words(line: string): string[] {
  const out: string[] = [];
  let start = 0;
  let i = 0;
  while (i < line.length) {
    const c = line[i];
    if (c === " ") {
      out.push(line.slice(start, i));
      start = ++i;
    } else if (c === "\\") {
      i += 2;
    } else if (
      (c === "'" && !isWordChar(line[i - 1])) || c === '"' || c === "`"
    ) {
      const end = closing(line, i + 1, c, c === "'" && line[i - 1] === "$");
      i = end === -1 ? i + 1 : end + 1;
    } else {
      i++;
    }
  }
  out.push(line.slice(start));
  return out;
}

/**
 * Where the quote `quote` opened before `from` closes, or -1. In bash's
 * `$'…'` (`ansi`), as in `"…"`, a backslash escapes the next character.
 */
function closing(
  line: string,
  from: number,
  quote: string,
  ansi: boolean,
): number {
  for (let i = from; i < line.length; i++) {
    const c = line[i];
    if ((quote === '"' || ansi) && c === "\\") i++;
    else if (c !== quote) continue;
    else if (quote === '"' && line[i + 1] === '"') i++;
    else if (quote === "'" && !ansi && isWordChar(line[i + 1])) continue;
    else return i;
  }
  return -1;
}
