/**
 * The command line's words, read: options, the one path a command takes,
 * seconds, and `--meta KEY=VALUE`. A mistake is a {@linkcode UsageError}.
 *
 * @module
 */

import { redact } from "../_redact.ts";

/** The exit code of a usage error. */
export const EX_USAGE = 2;

/** A mistake in the command line: printed with the usage, exit 2. */
export class UsageError extends Error {}

/** `--help` or `-h` among a command's options: its help, exit 0. */
export class HelpWanted extends Error {}

/**
 * How an option takes its value: "flag" none, "value" after "=",
 * "optional" after "=" or none, "repeat" after "=" or as the next word,
 * any number of times.
 */
type Kind = "flag" | "value" | "optional" | "repeat";

/**
 * Parses options up to the first word that does not start with "-", or a
 * `--`: `options` (`true` for a flag, or an optional without a value),
 * the values of each "repeat" option in `lists`, and the `rest` (a `--`
 * included). `--help` and `-h` throw {@linkcode HelpWanted}. Any other
 * word that starts with "-" is an unknown option, never a path (`command`
 * names the command whose path goes after "--" then).
 */
export function parse(
  args: string[],
  known: Record<string, Kind>,
  command?: string,
): {
  options: Map<string, string | true>;
  lists: Map<string, string[]>;
  rest: string[];
} {
  const options = new Map<string, string | true>();
  const lists = new Map<string, string[]>();
  let i = 0;
  for (; i < args.length; i++) {
    const arg = args[i];
    if (arg === "--") break;
    const shown = redact(arg);
    if (arg === "--help" || arg === "-h") throw new HelpWanted();
    if (!arg.startsWith("-")) break;
    if (!arg.startsWith("--")) {
      throw new UsageError(
        command === undefined
          ? `unknown option '${shown}'`
          : `unknown option '${shown}' (a path that starts with "-" goes after "--": runlock ${command} -- ${shown} ...)`,
      );
    }
    const eq = arg.indexOf("=");
    const name = eq < 0 ? arg.slice(2) : arg.slice(2, eq);
    let value = eq < 0 ? undefined : arg.slice(eq + 1);
    const kind = known[name];
    if (kind === undefined) throw new UsageError(`unknown option '${shown}'`);
    if (kind === "flag" && value !== undefined) {
      throw new UsageError(`option '--${name}' takes no value`);
    }
    if (kind === "repeat") {
      if (value === undefined) {
        const next = args[i + 1];
        if (next === undefined || next === "--") {
          throw new UsageError(
            `option '--${name}' needs KEY=VALUE: --${name} KEY=VALUE`,
          );
        }
        value = next;
        i++;
      }
      lists.set(name, [...lists.get(name) ?? [], value]);
      continue;
    }
    if (kind === "value" && value === undefined) {
      const next = args[i + 1] ?? "";
      throw new UsageError(
        /^\d+(\.\d*)?$/.test(next)
          ? `option '--${name}' takes its value after '=': write --${name}=${next}`
          : `option '--${name}' needs a value: --${name}=...`,
      );
    }
    options.set(name, value ?? true);
  }
  return { options, lists, rest: args.slice(i) };
}

/** An option's value as seconds; undefined when not given or no value. */
export function seconds(
  name: string,
  value: string | true | undefined,
): number | undefined {
  if (value === undefined || value === true) return undefined;
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n) || n < 0) {
    throw new UsageError(
      `option '--${name}' must be a non-negative number of seconds: current value is '${value}'`,
    );
  }
  return n;
}

/**
 * The one path (or name) a command takes, after an optional `--`; with
 * `what` "", an optional one, "" when missing.
 */
export function onePath(
  args: string[],
  command: string,
  what = "<path>",
): string {
  const rest = args[0] === "--" ? args.slice(1) : args;
  if (rest.length === 0) {
    if (what === "") return "";
    throw new UsageError(`${command}: missing ${what}`);
  }
  if (rest.length > 1) {
    // `status k --db=URL`: quoted without the password.
    throw new UsageError(
      `${command}: unexpected argument '${redact(rest[1])}'`,
    );
  }
  return rest[0];
}

// The library's `meta` rules, checked first so that a bad --meta is a usage
// error before anything touches the disk or the network. A value may hold
// no line end (LF, CR, VT, FF, NEL, U+2028, U+2029) nor control but tab.
const META_KEY = /^[a-z0-9_.-]{1,64}$/;
// deno-lint-ignore no-control-regex -- control characters are the point
const META_BAD_VALUE = /[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]/;

/** The `--meta KEY=VALUE` options as an object. */
export function metaOptions(values: string[]): Record<string, string> {
  const meta: Record<string, string> = Object.create(null);
  for (const item of values) {
    const eq = item.indexOf("=");
    if (eq < 0) {
      throw new UsageError(
        `option '--meta' takes KEY=VALUE: current value is '${redact(item)}'`,
      );
    }
    const key = item.slice(0, eq);
    const value = item.slice(eq + 1);
    if (!META_KEY.test(key)) {
      throw new UsageError(
        `option '--meta': the key '${
          redact(key)
        }' must be 1 to 64 of a-z 0-9 _ . -`,
      );
    }
    if (key === "__proto__") {
      throw new UsageError(`option '--meta': the key '${key}' is reserved`);
    }
    if (META_BAD_VALUE.test(value)) {
      throw new UsageError(
        `option '--meta': the value of '${key}' must be one line, without control characters`,
      );
    }
    if (Object.hasOwn(meta, key)) {
      throw new UsageError(`option '--meta': the key '${key}' is given twice`);
    }
    meta[key] = value;
  }
  return meta;
}
