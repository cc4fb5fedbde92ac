// The README's tested blocks: each is marked by an HTML comment
// `<!-- readme-test: NAME ... -->` just above its fence, so that the tests
// run the README's own text, not a copy of it.
import { readFileSync } from "node:fs";
import { join } from "node:path";

/** The repository root (this file is in tests/). */
export const root: string = join(new URL(".", import.meta.url).pathname, "..");

/** A fenced block of the README: its info string and its text. */
export interface Block {
  lang: string;
  text: string;
}

/** The block after the marker `<!-- readme-test: name`. */
export function readmeBlock(name: string, file = "README.md"): Block {
  const readme = readFileSync(join(root, file), "utf8");
  const at = readme.indexOf(`<!-- readme-test: ${name}`);
  if (at < 0) throw new Error(`README has no block marked ${name}`);
  const m = readme.slice(at).match(/\n```([^\n]*)\n([\s\S]*?)\n```/);
  if (!m) throw new Error(`no fenced block after the marker ${name}`);
  return { lang: m[1].trim(), text: m[2] + "\n" };
}

/** The command lines of a shell block (comment lines and blanks left out). */
export function commandLines(block: Block): string[] {
  return block.text.split("\n").filter((l) =>
    l.trim() !== "" && !l.trim().startsWith("#")
  );
}
