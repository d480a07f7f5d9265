// The daemon speaks snake_case (docs/PROTOCOL.md); JavaScript reads camelCase. Keys are
// converted, values (event kinds, reasons, states) are kept as the protocol spells them.

const camelKey = (key) => key.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());

/** A copy of a JSON value with every object key in camelCase. */
export function camelCase(value) {
  if (Array.isArray(value)) return value.map(camelCase);
  if (value === null || typeof value !== "object") return value;
  return Object.fromEntries(Object.entries(value).map(([k, v]) => [camelKey(k), camelCase(v)]));
}
