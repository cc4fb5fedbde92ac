/**
 * An error whose message the CLI prints as it is, on several lines if it
 * has them: runlock's own words, with what came from outside (a lock name,
 * the server's message) already made printable where it was put in. Every
 * other error's message is made printable whole (see printableErrors).
 *
 * @module
 */

/** A message laid out by the CLI, printed as it is. */
export class Said extends Error {
  /**
   * Creates the error.
   *
   * @param lines The message's lines, each safe for a terminal.
   * @param options `cause`: the error it says.
   */
  constructor(lines: string[], options?: ErrorOptions) {
    super(lines.join("\n"), options);
    this.name = "Said";
  }
}
