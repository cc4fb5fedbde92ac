/**
 * User fields of a lock record (`meta`): what a run is, in a few `key=value`
 * pairs that every prober can read. Shared by every backend, so that the
 * same input is refused the same way everywhere, before anything touches a
 * disk or a database.
 *
 * @module
 */

/**
 * User fields of a lock record: keys `[a-z0-9_.-]{1,64}`, one-line values.
 *
 * @example Saying what a run is
 * ```ts
 * import { acquire, inspect, type Meta } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * const meta: Meta = { cmd: "./sync.sh --full", "job.id": "42" };
 * await using lock = await acquire(`${dir}/run.lock`, { meta });
 * assert.deepEqual((await inspect(lock.path)).meta, meta);
 * ```
 */
export type Meta = Record<string, string>;

const KEY = /^[a-z0-9_.-]{1,64}$/;
// Anything a reader could take for the end of a line (LF, CR, VT, FF, NEL,
// U+2028, U+2029: Python's splitlines() breaks on all of them), and every
// other control character but tab (NUL ends C strings in readers).
// deno-lint-ignore no-control-regex -- matching control characters is the point
const BAD_CHAR = /[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]/;
// A lone surrogate has no UTF-8 encoding.
const LONE_SURROGATE =
  /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * Checks user fields and returns a plain copy of them.
 *
 * @param meta What the caller passed (`undefined` gives `{}`).
 * @param action What is being done, for the message (`"acquire the lock"`).
 * @returns A new plain object with the same fields.
 * @throws {TypeError} `meta` is not a plain object, or a value is not a string.
 * @throws {RangeError} a key does not match `[a-z0-9_.-]{1,64}` (or is
 * `__proto__`), or a value holds a line break, a control character or text
 * that is not valid UTF-8.
 */
export function checkMeta(meta: unknown, action = "acquire the lock"): Meta {
  if (meta === undefined) return {};
  if (
    meta === null || typeof meta !== "object" || Array.isArray(meta) ||
    (Object.getPrototypeOf(meta) !== Object.prototype &&
      Object.getPrototypeOf(meta) !== null)
  ) {
    throw new TypeError(
      `Cannot ${action} as 'meta' must be a plain object of strings: current value is ${
        Array.isArray(meta) ? "an array" : String(meta)
      }`,
    );
  }
  const out: Meta = {};
  // (`__proto__` is refused above: as a key of a plain object it would set
  // the prototype instead of a field.)
  for (const [key, value] of Object.entries(meta)) {
    if (!KEY.test(key) || key === "__proto__") {
      throw new RangeError(
        `Cannot ${action} as the meta key ${
          JSON.stringify(key)
        } must match [a-z0-9_.-]{1,64}`,
      );
    }
    if (typeof value !== "string") {
      throw new TypeError(
        `Cannot ${action} as meta.${key} must be a string: current value is ${typeof value}`,
      );
    }
    if (BAD_CHAR.test(value)) {
      throw new RangeError(
        `Cannot ${action} as meta.${key} must be one line without NUL or other control characters: current value is ${
          JSON.stringify(value.slice(0, 60))
        }`,
      );
    }
    if (LONE_SURROGATE.test(value)) {
      throw new RangeError(
        `Cannot ${action} as meta.${key} is not valid UTF-8 text (a lone surrogate)`,
      );
    }
    out[key] = value;
  }
  return out;
}
