/**
 * JSON that keeps big integers. Loom answers versions and instants as integers of
 * nanoseconds, past 2^53, where `JSON.parse` would round them to a neighbouring double.
 * `parse` reads every integer token itself: a member named in `wide` (versions, `*_at`
 * instants) becomes a `bigint`, as does any other integer a double cannot hold exactly;
 * the rest are numbers. `stringify` writes a `bigint` as a plain JSON integer.
 */

export type Json = null | boolean | number | bigint | string | Json[] | { [key: string]: Json };

const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/y;
const SPACE = /[ \t\n\r]*/y;

export function parse(text: string, wide: ReadonlySet<string> = new Set()): Json {
  let at = 0;
  const fail = (what: string): never => {
    throw new SyntaxError(`invalid JSON at ${at}: ${what}`);
  };
  const space = (): void => {
    SPACE.lastIndex = at;
    SPACE.exec(text);
    at = SPACE.lastIndex;
  };
  const string = (): string => {
    const start = at;
    at += 1;
    for (;;) {
      const next = text.indexOf('"', at);
      if (next < 0) fail("unterminated string");
      let slashes = 0;
      for (let back = next - 1; text[back] === "\\"; back -= 1) slashes += 1;
      at = next + 1;
      if (slashes % 2 === 0) break;
    }
    return JSON.parse(text.slice(start, at)) as string; // escapes, by the platform's rules
  };
  const value = (key: string | null): Json => {
    space();
    const head = text[at];
    if (head === "{") {
      at += 1;
      const found: { [key: string]: Json } = {};
      space();
      if (text[at] === "}") {
        at += 1;
        return found;
      }
      for (;;) {
        space();
        if (text[at] !== '"') fail("expected a member name");
        const name = string();
        space();
        if (text[at] !== ":") fail("expected ':'");
        at += 1;
        Object.defineProperty(found, name, {
          value: value(name), enumerable: true, writable: true, configurable: true,
        });
        space();
        if (text[at] === ",") {
          at += 1;
          continue;
        }
        if (text[at] === "}") {
          at += 1;
          return found;
        }
        fail("expected ',' or '}'");
      }
    }
    if (head === "[") {
      at += 1;
      const items: Json[] = [];
      space();
      if (text[at] === "]") {
        at += 1;
        return items;
      }
      for (;;) {
        items.push(value(null));
        space();
        if (text[at] === ",") {
          at += 1;
          continue;
        }
        if (text[at] === "]") {
          at += 1;
          return items;
        }
        fail("expected ',' or ']'");
      }
    }
    if (head === '"') return string();
    for (const [word, meant] of [["true", true], ["false", false], ["null", null]] as const) {
      if (text.startsWith(word, at)) {
        at += word.length;
        return meant;
      }
    }
    NUMBER.lastIndex = at;
    const match = NUMBER.exec(text);
    if (!match) return fail("unexpected character");
    at = NUMBER.lastIndex;
    const token = match[0];
    if (match[1] !== undefined || match[2] !== undefined) return Number(token);
    if ((key !== null && wide.has(key)) || !Number.isSafeInteger(Number(token))) {
      return BigInt(token);
    }
    return Number(token);
  };
  const found = value(null);
  space();
  if (at !== text.length) fail("trailing characters");
  return found;
}

/** JSON text of `value`; a bigint is written as an integer, undefined members are left out. */
export function stringify(value: unknown): string {
  if (typeof value === "bigint") return value.toString();
  if (value === null || typeof value !== "object") {
    return JSON.stringify(value) ?? "null";
  }
  if (Array.isArray(value)) {
    return "[" + value.map((item) => (item === undefined ? "null" : stringify(item))).join(",") + "]";
  }
  const parts: string[] = [];
  for (const [name, item] of Object.entries(value)) {
    if (item === undefined || typeof item === "function") continue;
    parts.push(JSON.stringify(name) + ":" + stringify(item));
  }
  return "{" + parts.join(",") + "}";
}
