/**
 * A table fitted to a terminal's width, as `ls --watch` draws it.
 *
 * @module
 */

import { cutEnd, cutStart, width } from "./_width.ts";

/** The columns between two cells. */
const GAP = 2;

/** How a table gives way to a narrow terminal: see fitTable. */
interface Fit {
  shrink: number;
  shrinkMin: number;
  drop: readonly number[];
}

function widest(rows: readonly string[][], i: number): number {
  return Math.max(0, ...rows.map((row) => width(row[i])));
}

/**
 * `rows` (header first, printable cells) fitted to `columns`, as the cells
 * to align. While too wide, column `fit.shrink` is cut from its end down
 * to `fit.shrinkMin`; then the columns of `fit.drop` go, one by one; last,
 * the last column (the path) is cut from its start, keeping the end that
 * names the lock. What is still too wide is the caller's to cut.
 *
 * @example Narrow: the command is cut, then dropped; the path stays whole
 * (the doc test imports `fitTable` itself)
 * ```ts
 * import assert from "node:assert/strict";
 *
 * const rows = [
 *   ["STATE", "PID", "COMMAND", "PATH"],
 *   ["held", "4242", "./backup.sh nightly", "/srv/state/backup.lock"],
 * ];
 * const fit = { shrink: 2, shrinkMin: 8, drop: [2, 1] };
 * assert.deepEqual(fitTable(rows, 45, fit)[1], [
 *   "held",
 *   "4242",
 *   "./backu…",
 *   "/srv/state/backup.lock",
 * ]);
 * assert.deepEqual(fitTable(rows, 40, fit)[1], [
 *   "held",
 *   "4242",
 *   "/srv/state/backup.lock",
 * ]);
 * assert.deepEqual(fitTable(rows, 20, fit)[1], ["held", "…/backup.lock"]);
 * ```
 */
export function fitTable(
  rows: readonly string[][],
  columns: number,
  fit: Fit,
): string[][] {
  const count = rows[0]?.length ?? 0;
  const last = count - 1;
  const all = [...Array(count).keys()];
  let shown = all;
  let shrinkTo: number | undefined;
  for (let dropped = 0; dropped <= fit.drop.length; dropped++) {
    const gone = new Set(fit.drop.slice(0, dropped));
    shown = all.filter((i) => i === 0 || i === last || !gone.has(i));
    const shrinks = shown.includes(fit.shrink);
    const others = shown.reduce(
      (sum, i) => i === fit.shrink ? sum : sum + widest(rows, i),
      GAP * (shown.length - 1),
    );
    const room = columns - others;
    const wanted = shrinks ? widest(rows, fit.shrink) : 0;
    const least = Math.min(wanted, fit.shrinkMin);
    if (room >= least) {
      if (shrinks && wanted > room) shrinkTo = room;
      break;
    }
    // Nothing left to drop: the shrinking column at its least, if shown.
    if (dropped === fit.drop.length && shrinks && wanted > least) {
      shrinkTo = least;
    }
  }
  const widths = shown.map((i) =>
    i === fit.shrink && shrinkTo !== undefined ? shrinkTo : widest(rows, i)
  );
  const pathRoom = columns - GAP * (shown.length - 1) -
    widths.slice(0, -1).reduce((sum, w) => sum + w, 0);
  return rows.map((row) =>
    shown.map((i) => {
      if (i === last) return cutStart(row[i], pathRoom);
      if (i === fit.shrink && shrinkTo !== undefined) {
        return cutEnd(row[i], shrinkTo);
      }
      return row[i];
    })
  );
}
