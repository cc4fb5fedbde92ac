// A local copy of the rules of src/meta.ts's checkMeta (being added by the
// core engineer, not yet committed), so both backends refuse the same
// input the same way. Replace this file with
// `import { checkMeta } from "../meta.ts"` once that lands.
// (PostgreSQL's jsonb cannot store NUL, which these rules refuse too.)

const KEY = /^[a-z0-9_.-]{1,64}$/;
// Line breaks would start a new record line; NUL ends C strings in readers.
const BAD_CHAR = /[\n\r\0]/;
// A lone surrogate has no UTF-8 encoding.
const LONE_SURROGATE =
  /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * Checks user fields and returns a plain copy of them.
 *
 * @throws {TypeError} `meta` is not a plain object, or a value is not a string.
 * @throws {RangeError} a key does not match `[a-z0-9_.-]{1,64}`, or a value
 * holds a line break, a NUL or text that is not valid UTF-8.
 */
export function checkMeta(
  meta: unknown,
  action = "acquire the lock",
): Record<string, string> {
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
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(meta)) {
    if (!KEY.test(key)) {
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
        `Cannot ${action} as meta.${key} must be one line without NUL: current value is ${
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
