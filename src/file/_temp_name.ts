/**
 * Temp names, `.<stem>.<16 hex digits>.tmp` (PROTOCOL.md, "Litter"): the
 * stem is the lock's name, cut so that the temp name fits in NAME_MAX bytes.
 *
 * @module
 */

const encoder = new TextEncoder();

// A random 32-bit prefix per process and a counter: no system call or random
// draw per name, still unpredictable; O_EXCL settles a collision. Drawn on
// the first name, not at import: Node loads its Web Crypto code for it.
let processTag = "";
let tempCounter = 0;

/** A fresh temp name for a lock named `name`. */
export function tempName(name: string): string {
  if (processTag === "") {
    processTag = Array.from(
      crypto.getRandomValues(new Uint8Array(4)),
      (b) => b.toString(16).padStart(2, "0"),
    ).join("");
  }
  tempCounter = (tempCounter + 1) >>> 0;
  return `.${tempStem(name)}.${processTag}${
    tempCounter.toString(16).padStart(8, "0")
  }.tmp`;
}

// The longest file name (NAME_MAX) on the filesystems runlock supports.
const NAME_MAX = 255;
// "." + 16 hex digits + ".tmp" after the stem.
const TAIL = 21;

/** `name`, cut at a character boundary so that its temp name fits NAME_MAX. */
export function tempStem(name: string): string {
  const room = NAME_MAX - TAIL - 1;
  if (name.length * 3 <= room) return name; // fast path: fits whatever it is
  let bytes = 0;
  let end = 0;
  for (const ch of name) {
    const size = encoder.encode(ch).length;
    if (bytes + size > room) break;
    bytes += size;
    end += ch.length;
  }
  return name.slice(0, end);
}

/** The stem of the temp name `name`, or `undefined` if it is none. */
export function stemOfTemp(name: string): string | undefined {
  const at = name.length - TAIL;
  if (
    at < 1 || name.charCodeAt(0) !== 0x2e || name.charCodeAt(at) !== 0x2e ||
    !name.endsWith(".tmp")
  ) return undefined;
  for (let i = at + 1; i < name.length - 4; i++) {
    const c = name.charCodeAt(i);
    if (!((c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66))) {
      return undefined;
    }
  }
  return name.slice(1, at);
}

/** Whether `stem` may be a longer name, cut by {@linkcode tempStem}. */
export function stemMayBeCut(stem: string): boolean {
  return stem.length * 3 > NAME_MAX - TAIL - 5;
}

/** Whether `name` is a temp name. */
export function isTempName(name: string): boolean {
  return stemOfTemp(name) !== undefined;
}
