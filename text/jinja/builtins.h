// The filters, tests, attribute and item access and methods of Jinja values, as jinja2's
// ImmutableSandboxedEnvironment gives them to transformers' chat templates (with transformers'
// own `tojson`: ensure_ascii=False, indent, separators and sort_keys arguments).
//
// Filters: abs, capitalize, count, d, default, dictsort, e, escape, first, float, indent, int,
//   items, join, last, length, list, lower, map, max, min, reject, rejectattr, replace, reverse,
//   round, safe, select, selectattr, sort, string, sum, title, tojson, trim, unique, upper.
// Tests: boolean, callable, defined, divisibleby, eq, equalto, even, false, float, ge, gt,
//   greaterthan, in, integer, iterable, le, lower, lt, lessthan, mapping, ne, none, number, odd,
//   sameas, sequence, string, true, undefined, upper, ==, !=, <, <=, >, >=.
// Methods: of strings (startswith, endswith, split, rsplit, splitlines, strip, lstrip, rstrip,
//   upper, lower, title, capitalize, replace, format, find, count, join, removeprefix,
//   removesuffix, isdigit, isalpha, isspace, islower, isupper), of dicts (get, items, keys,
//   values, copy) and of lists (index, count). The immutable sandbox refuses the methods that
//   change a list or dict (append, pop, update, ...): calling one is an error, as in jinja2.
// Case mapping (upper, lower, title, capitalize) changes ASCII letters only.
//
// All of them throw ValueError for what jinja2 would refuse (a TypeError, an undefined value
// used); the interpreter adds the template's name and line.
#pragma once

#include <string>

#include "text/jinja/value.h"

namespace baton::data::jinja {

bool is_filter(const std::string& name);
bool is_test(const std::string& name);
// A method name of str, dict or list that templates may call (the unsafe ones included: they
// fail when called, as in jinja2).
bool is_method(const std::string& name);
// The global functions of transformers' environment: range, namespace, dict, raise_exception,
// strftime_now (defined by the interpreter, which knows the render options).
bool is_global_function(const std::string& name);

Value apply_filter(const std::string& name, const Value& value, CallArgs& args);
bool apply_test(const std::string& name, const Value& value, CallArgs& args);

// `obj.name`: a method, a dict's item, a namespace's attribute; undefined when there is none.
// Throws for an undefined `obj`.
Value get_attribute(const Value& obj, const std::string& name);
// `obj[key]`: an item (negative indices count from the end), else an attribute as jinja2 falls
// back to; undefined when there is none. Throws for an undefined `obj`.
Value get_item(const Value& obj, const Value& key);
// `obj[start:stop:step]` of a list or string (undefined bounds for the ones left out).
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

}  // namespace baton::data::jinja
