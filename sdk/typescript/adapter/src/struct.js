// google.protobuf.Struct as decoded by proto-loader, to and from plain JSON values. protobufjs
// bundles the well-known types with camelCase member names whatever keepCase says, so the names
// are read from the loaded descriptor, not assumed.
import { adapterPackage } from './proto.js';

const kinds = ['null_value', 'number_value', 'string_value', 'bool_value', 'struct_value', 'list_value'];
let names;

/** The loaded member names of google.protobuf.Value, by their proto names. */
export function valueNames() {
  if (!names) {
    const loaded = adapterPackage()['google.protobuf.Value'].type.field.map((f) => f.name);
    names = {};
    for (const k of kinds) {
      names[k] = loaded.find((n) => n.replace(/_/g, '').toLowerCase() === k.replace(/_/g, '')) ?? k;
    }
  }
  return names;
}

/** The proto name of the kind a decoded Value holds, or '' when none is set. */
export function kindOf(v) {
  const n = valueNames();
  if (!v) return '';
  const set = v.kind;
  for (const k of kinds) {
    if (set === n[k] || set === k) return k;
  }
  // Decoded without oneofs: the first member present.
  for (const k of kinds) {
    if (v[n[k]] !== undefined && v[n[k]] !== null) return k;
  }
  return '';
}

/** The content of a decoded Value of kind k. */
export function member(v, k) {
  return v[valueNames()[k]] ?? v[k];
}

/** A decoded Struct (or undefined) as a plain object. */
export function structToJS(s) {
  const out = {};
  for (const [key, v] of Object.entries(s?.fields ?? {})) out[key] = valueToJS(v);
  return out;
}

function valueToJS(v) {
  switch (kindOf(v)) {
    case 'number_value': return member(v, 'number_value');
    case 'string_value': return member(v, 'string_value');
    case 'bool_value': return member(v, 'bool_value');
    case 'struct_value': return structToJS(member(v, 'struct_value'));
    case 'list_value': return (member(v, 'list_value')?.values ?? []).map(valueToJS);
    default: return null;
  }
}

/**
 * A plain JSON object as a Struct to encode. It throws a TypeError for what JSON cannot carry
 * (NaN, ±Infinity, BigInt, functions, symbols, cycles); objects with toJSON go through it, as
 * JSON.stringify does.
 */
export function structFromJS(obj) {
  if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) {
    throw new TypeError('a result or progress must be a JSON object');
  }
  return structOf(obj, new Set());
}

function structOf(obj, seen) {
  if (seen.has(obj)) throw new TypeError('a cycle is not representable as JSON');
  seen.add(obj);
  const fields = {};
  for (const [key, v] of Object.entries(obj)) {
    if (v === undefined || typeof v === 'function' || typeof v === 'symbol') continue;
    fields[key] = valueOf(v, seen);
  }
  seen.delete(obj);
  return { fields };
}

function valueOf(v, seen) {
  const n = valueNames();
  if (v !== null && typeof v === 'object' && typeof v.toJSON === 'function') v = v.toJSON();
  if (v === null || v === undefined) return { [n.null_value]: 0 };
  switch (typeof v) {
    case 'number':
      if (!Number.isFinite(v)) throw new TypeError(`${v} is not representable as JSON`);
      return { [n.number_value]: v };
    case 'string': return { [n.string_value]: v };
    case 'boolean': return { [n.bool_value]: v };
    case 'object':
      if (Array.isArray(v)) {
        if (seen.has(v)) throw new TypeError('a cycle is not representable as JSON');
        seen.add(v);
        const values = v.map((e) => (e === undefined || typeof e === 'function' ? { [n.null_value]: 0 } : valueOf(e, seen)));
        seen.delete(v);
        return { [n.list_value]: { values } };
      }
      return { [n.struct_value]: structOf(v, seen) };
    default:
      throw new TypeError(`a ${typeof v} is not representable as JSON`);
  }
}
