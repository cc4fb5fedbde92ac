/**
 * How wide a text shows on a terminal, how to cut it to a width, and how
 * to break a message into lines. Texts are measured and cut by grapheme
 * clusters, each as wide as wcwidth(3) counts its first code point: 2 for
 * East Asian Wide and Fullwidth characters and emoji shown as emoji, 0 for
 * combining marks alone, 1 otherwise.
 *
 * @module
 */

const ELLIPSIS = "…";

/** East Asian Wide and Fullwidth, as Markus Kuhn's wcwidth() lists them. */
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

const EMOJI = /^\p{Emoji_Presentation}/u;
const MARKS = /^\p{M}+$/u;
/** VARIATION SELECTOR-16: show as an emoji. */
const AS_EMOJI = "\ufe0f";

function wide(code: number): boolean {
  for (const [from, to] of WIDE) {
    if (code < from) return false;
    if (code <= to) return true;
  }
  return false;
}

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

/** Without Intl.Segmenter: each code point and the marks after it. */
function clusters(text: string): string[] {
  if (segmenter) return [...segmenter.segment(text)].map((s) => s.segment);
  return text.match(/\P{M}\p{M}*|\p{M}+/gsu) ?? [];
}

/**
 * How many columns a printable `text` takes on a terminal.
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
  if (/^[\x20-\x7e]*$/.test(text)) return text.length;
  let sum = 0;
  for (const cluster of clusters(text)) sum += clusterWidth(cluster);
  return sum;
}

/**
 * `text` cut to at most `max` columns (0 or less: ""), keeping its start
 * and ending in "…"; a wide character that would straddle the edge goes.
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
 * `text` cut as {@linkcode cutEnd} does, but keeping its end: for a path,
 * whose end names the lock.
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
 * `text` broken at spaces into lines of at most `max` columns, as messages
 * are printed on a terminal; a continuation is indented two spaces more.
 * What is meant to be copied is never broken: a line indented by two
 * spaces (a command, SQL), and a quoted span (`'…'`, `"…"`, backquotes;
 * SQL's `""` and a backslash escape close nothing, and an apostrophe in
 * "it's" or "users'" is no quote). A word wider than `max` stays whole.
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

const isWordChar = (c: string | undefined) =>
  c !== undefined && /[\p{L}\p{N}]/u.test(c);

/** `line` split at the spaces outside quoted spans (closed ones). */
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
 * Where the quote opened before `from` closes, or -1. In bash's `$'…'`
 * (`ansi`), as in `"…"`, a backslash escapes the next character.
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
