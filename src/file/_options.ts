/**
 * The checks of `acquire`'s options, and the record they make.
 *
 * @module
 */

import { DEFAULT_MODE } from "./_protocol.ts";
import {
  identityHere,
  type RecordTemplate,
  recordTemplate,
} from "./_record_here.ts";
import { CHILD_OPTION } from "./_inherit.ts";
import { CHILD_LINE, MAX_RECORD_BYTES, metaLines } from "./record.ts";
import type { AcquireSyncOptions } from "./types.ts";
import { checkMeta, type Meta } from "../meta.ts";

/** "1 byte", "2 bytes". */
const bytesOf = (n: number) => `${n} byte${n === 1 ? "" : "s"}`;

const encoder = new TextEncoder();

/** Options checked, with the record they make. */
export interface Checked {
  timeout: number;
  mode: number;
  meta: Meta;
  record: RecordTemplate;
  checkInterval: number;
}

// The options of an acquire that passes none: checked once.
let defaults: Checked | undefined;

/**
 * Checks `options` and makes the record they ask for.
 *
 * @throws {RangeError} an option is out of range, or the record too large.
 */
export function checkOptions(
  options: AcquireSyncOptions | undefined,
): Checked {
  if (options === undefined) return defaults ??= check(undefined);
  return check(options);
}

function check(options: AcquireSyncOptions | undefined): Checked {
  const timeout = options?.timeout ?? 0;
  if (typeof timeout !== "number" || Number.isNaN(timeout) || timeout < 0) {
    throw new RangeError(
      `Cannot acquire the lock as 'timeout' must be a non-negative number of milliseconds: current value is ${
        String(timeout)
      }`,
    );
  }
  const mode = options?.mode ?? DEFAULT_MODE;
  if (
    typeof mode !== "number" || !Number.isInteger(mode) || mode < 0 ||
    mode > 0o777 || (mode & 0o400) === 0
  ) {
    throw new RangeError(
      `Cannot acquire the lock as 'mode' must be permission bits from 0o400 to 0o777 that let the owner read: current value is ${
        typeof mode === "number" ? `0o${mode.toString(8)}` : String(mode)
      }`,
    );
  }
  const checkInterval = options?.checkInterval ?? 1000;
  if (
    typeof checkInterval !== "number" || !Number.isFinite(checkInterval) ||
    checkInterval < 0 || checkInterval > 0x7fffffff
  ) {
    throw new RangeError(
      `Cannot acquire the lock as 'checkInterval' must be a finite number of milliseconds from 0 (never): current value is ${
        String(checkInterval)
      }`,
    );
  }
  const meta = checkMeta(options?.meta);
  // `runlock run`'s option (`_inherit.ts`).
  const child =
    (options as { [CHILD_OPTION]?: unknown } | undefined)?.[CHILD_OPTION] ===
        true
      ? CHILD_LINE
      : "";
  const record = recordTemplate(identityHere() + child + metaLines(meta));
  const size = record.bytes.length;
  if (size > MAX_RECORD_BYTES) {
    const bytes = (text: string) => encoder.encode(text).length;
    const [longest, value] = Object.entries(meta).sort((a, b) =>
      bytes(b[1]) - bytes(a[1])
    )[0] ?? ["", ""];
    const own = recordTemplate(identityHere() + child).bytes.length;
    const over = size - MAX_RECORD_BYTES;
    throw new RangeError(
      `Cannot acquire the lock as the record would be ${size} bytes, over ${MAX_RECORD_BYTES} (runlock's own lines take ${own}): ${
        over <= bytes(value)
          ? `shorten meta.${longest} by ${bytesOf(over)}`
          : `shorten the meta by ${
            bytesOf(over)
          } (meta.${longest} is the longest)`
      }`,
    );
  }
  return { timeout, mode, meta, record, checkInterval };
}
