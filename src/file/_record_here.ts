/**
 * What this process writes: the record, encoded once per distinct `meta`,
 * the start time written in place; and the probe's byte-level reads of a
 * record's first lines.
 *
 * @module
 */

import { platform as p } from "../platform/current.ts";
import { formatRecord, MARKER_WORD, MAX_PID, recordHead } from "./record.ts";

const encoder = new TextEncoder();
const MARKER_BYTES = encoder.encode(MARKER_WORD);

/**
 * The PID on line 1 of `head`, as `parseRecord` reads it, else 0 (a trailing
 * CR or a BOM too, which `parseRecord` drops).
 */
export function headPid(head: Uint8Array): number {
  let end = head.indexOf(10);
  if (end < 0) end = head.length;
  if (end === 0 || end > 10 || head[0] < 0x31 || head[0] > 0x39) return 0;
  let pid = 0;
  for (let i = 0; i < end; i++) {
    const digit = head[i] - 0x30;
    if (digit < 0 || digit > 9) return 0;
    pid = pid * 10 + digit;
  }
  return pid <= MAX_PID ? pid : 0;
}

/** Whether line 2 of `head` is the marker, as `parseRecord` reads it. */
export function headHasMarker(head: Uint8Array): boolean {
  const first = head.indexOf(10);
  if (first < 0) return false;
  let i = first + 1;
  for (let k = 0; k < MARKER_BYTES.length; k++) {
    if (head[i++] !== MARKER_BYTES[k]) return false;
  }
  const start = i;
  if (head[i] < 0x31 || head[i] > 0x39) return false;
  while (i < head.length && head[i] >= 0x30 && head[i] <= 0x39) i++;
  if (i - start > 9) return false;
  if (head[i] === 13) i++;
  return head[i] === 10;
}

let head: string | undefined;
function recordHeadHere(): string {
  return head ??= recordHead(p.pid, p.hostname());
}
let identityLines: string | undefined;
/** `boot=` and `pidns=` lines for this process, where they can be read. */
export function identityHere(): string {
  if (identityLines === undefined) {
    const { boot, pidns } = p.identity();
    identityLines = (boot ? `boot=${boot}\n` : "") +
      (pidns ? `pidns=${pidns}\n` : "");
  }
  return identityLines;
}

/**
 * The record this process writes with `extra`, encoded once: each acquire
 * writes its start time (24 bytes for years 0 to 9999) in place.
 */
export interface RecordTemplate {
  /** The record, with the start time of the last {@linkcode recordBytes}. */
  readonly bytes: Uint8Array;
  /** Where the 24 bytes of the start time begin. */
  readonly at: number;
  /** The `extra` it was made for. */
  readonly extra: string;
}

const ISO_LENGTH = 24; // 2026-11-30T09:52:11.000Z

/** Templates by their variable part: encoded once per distinct meta. */
const templates = new Map<string, RecordTemplate>();

/** The record template for `extra` (see {@linkcode RecordTemplate}). */
export function recordTemplate(extra: string): RecordTemplate {
  let template = templates.get(extra);
  if (template === undefined) {
    const text = formatRecord(recordHeadHere(), new Date(0), p.runtime, extra);
    const at = encoder.encode(
      text.slice(0, text.indexOf("\nstarted=") + "\nstarted=".length),
    ).length;
    template = { bytes: encoder.encode(text), at, extra };
    if (templates.size >= 256) templates.clear(); // a bound, not a working set
    templates.set(extra, template);
  }
  return template;
}

// The start time's first 20 bytes, kept for the second they are for.
let isoSecond = NaN;
const isoHead = new Uint8Array(ISO_LENGTH - 4);

/** The record with `started` in it: valid until the next call. */
export function recordBytes(
  template: RecordTemplate,
  started: Date,
): Uint8Array {
  const ms = started.getTime();
  const second = Math.floor(ms / 1000);
  if (second !== isoSecond) {
    const iso = started.toISOString();
    if (iso.length !== ISO_LENGTH) {
      return encoder.encode(
        formatRecord(recordHeadHere(), started, p.runtime, template.extra),
      );
    }
    for (let i = 0; i < isoHead.length; i++) isoHead[i] = iso.charCodeAt(i);
    isoSecond = second;
  }
  const bytes = template.bytes;
  const at = template.at;
  bytes.set(isoHead, at);
  const milli = ms - second * 1000;
  bytes[at + 20] = 0x30 + Math.floor(milli / 100);
  bytes[at + 21] = 0x30 + Math.floor(milli / 10) % 10;
  bytes[at + 22] = 0x30 + milli % 10;
  return bytes;
}
