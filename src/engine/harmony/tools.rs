//! The `# Tools` section of the harmony developer message: each function as a TypeScript-like
//! type in `namespace functions`, written as gpt-oss's chat template writes it (its quirks
//! included, such as the line break before the type of a nested object's member), so the
//! model sees the prompt it was trained on.

use super::json::Json;

/// One function the model may call (`tools[i].function` of the request).
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    pub name: String,
    pub description: Option<String>,
    /// The JSON schema of the arguments (an object schema), keys in the client's order.
    pub parameters: Option<Json>,
}

fn type_is(spec: &Json, name: &str) -> bool {
    spec.get("type").and_then(Json::as_str) == Some(name)
}

fn is_truthy(spec: &Json, key: &str) -> bool {
    spec.get(key).is_some_and(Json::truthy)
}

/// A value the template concatenates as a string: strings as they are, anything else in
/// JSON (the template would fail on those; this keeps the prompt readable).
fn plain(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        other => other.to_python(),
    }
}

fn required_of(spec: &Json) -> Vec<&str> {
    spec.get("required")
        .and_then(Json::as_array)
        .map(|a| a.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default()
}

/// The TypeScript-like type of one JSON-schema node.
fn typescript_type(spec: &Json) -> String {
    let nullable = if is_truthy(spec, "nullable") {
        " | null"
    } else {
        ""
    };
    if type_is(spec, "array") {
        let inner = match spec.get("items") {
            None => return format!("any[]{nullable}"),
            Some(items) => match items.get("type").and_then(Json::as_str) {
                Some("string") => "string[]".to_string(),
                Some("number") | Some("integer") => "number[]".to_string(),
                Some("boolean") => "boolean[]".to_string(),
                _ => {
                    let inner = typescript_type(items);
                    if inner == "object | object" || inner.chars().count() > 50 {
                        "any[]".to_string()
                    } else {
                        format!("{inner}[]")
                    }
                }
            },
        };
        return format!("{inner}{nullable}");
    }
    if let Some(types) = spec.get("type").and_then(Json::as_array)
        && let Some(first) = types.first()
    {
        if types.len() > 1 {
            return types.iter().map(plain).collect::<Vec<_>>().join(" | ");
        }
        return plain(first);
    }
    if let Some(variants) = spec.get("oneOf").filter(|v| v.truthy()) {
        // The template's test for object variants sets a variable inside its loop, which
        // Jinja scopes to the loop: every oneOf is written as the union of its variants.
        let variants = variants.as_array().unwrap_or_default();
        let mut out = String::new();
        for (i, v) in variants.iter().enumerate() {
            out.push_str(&typescript_type(v));
            if let Some(d) = v.get("description").filter(|d| d.truthy()) {
                out.push_str("// ");
                out.push_str(&plain(d));
            }
            if let Some(d) = v.get("default") {
                out.push_str("                    // default: ");
                out.push_str(&d.to_python());
            }
            if i + 1 < variants.len() {
                out.push_str(" | \n");
            }
        }
        return out;
    }
    match spec.get("type").and_then(Json::as_str) {
        Some("string") => match spec.get("enum").filter(|e| e.truthy()) {
            Some(e) => {
                let names: Vec<String> =
                    e.as_array().unwrap_or_default().iter().map(plain).collect();
                format!("\"{}\"", names.join("\" | \""))
            }
            None => format!("string{nullable}"),
        },
        Some("number") | Some("integer") => "number".to_string(),
        Some("boolean") => "boolean".to_string(),
        Some("object") => match spec.get("properties").filter(|p| p.truthy()) {
            Some(props) => {
                let required = required_of(spec);
                let props = props.as_object().unwrap_or_default();
                let mut out = String::from("{\n");
                for (i, (name, prop)) in props.iter().enumerate() {
                    out.push_str(name);
                    if !required.contains(&name.as_str()) {
                        out.push('?');
                    }
                    // The template's own whitespace before a member's type.
                    out.push_str(": \n                ");
                    out.push_str(&typescript_type(prop));
                    if i + 1 < props.len() {
                        out.push_str(", ");
                    }
                }
                out.push('}');
                out
            }
            None => "object".to_string(),
        },
        _ => "any".to_string(),
    }
}

/// One function as `type NAME = (_: { … }) => any;` with its comments.
fn function_type(f: &Function, out: &mut String) {
    if let Some(d) = &f.description {
        out.push_str("// ");
        out.push_str(d);
        out.push('\n');
    }
    out.push_str("type ");
    out.push_str(&f.name);
    out.push_str(" = ");
    let params = f.parameters.as_ref();
    let props = params
        .and_then(|p| p.get("properties"))
        .filter(|p| p.truthy())
        .and_then(Json::as_object);
    let Some(props) = props else {
        out.push_str("() => any;\n\n");
        return;
    };
    let required = params.map(required_of).unwrap_or_default();
    out.push_str("(_: {\n");
    for (name, spec) in props {
        if let Some(d) = spec.get("description").filter(|d| d.truthy()) {
            out.push_str("// ");
            out.push_str(&plain(d));
            out.push('\n');
        }
        out.push_str(name);
        if !required.contains(&name.as_str()) {
            out.push('?');
        }
        out.push_str(": ");
        out.push_str(&typescript_type(spec));
        if let Some(d) = spec.get("default") {
            if is_truthy(spec, "enum") {
                out.push_str(", // default: ");
                out.push_str(&plain(d));
            } else if is_truthy(spec, "oneOf") {
                out.push_str("// default: ");
                out.push_str(&plain(d));
            } else {
                out.push_str(", // default: ");
                out.push_str(&d.to_python());
            }
        }
        out.push_str(",\n");
    }
    out.push_str("}) => any;\n\n");
}

/// The `## functions` namespace listing `functions`.
pub fn namespace(functions: &[Function]) -> String {
    let mut out = String::from("## functions\n\nnamespace functions {\n\n");
    for f in functions {
        function_type(f, &mut out);
    }
    out.push_str("} // namespace functions");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(schema: &str) -> String {
        typescript_type(&Json::parse(schema).unwrap())
    }

    #[test]
    fn schema_nodes_as_typescript() {
        assert_eq!(ts(r#"{"type":"string","enum":["a","b"]}"#), r#""a" | "b""#);
        assert_eq!(ts(r#"{"type":"string","nullable":true}"#), "string | null");
        assert_eq!(
            ts(r#"{"type":"array","items":{"type":"integer"}}"#),
            "number[]"
        );
        assert_eq!(ts(r#"{"type":"array"}"#), "any[]");
        assert_eq!(ts(r#"{"type":["string","null"]}"#), "string | null");
        assert_eq!(ts(r#"{"type":"object"}"#), "object");
        assert_eq!(ts(r#"{}"#), "any");
        assert_eq!(
            ts(
                r#"{"type":"array","items":{"type":"object","properties":{"a":{"type":"string"}}}}"#
            ),
            "{\na?: \n                string}[]"
        );
    }

    #[test]
    fn function_without_parameters() {
        let f = Function {
            name: "ping".into(),
            description: None,
            parameters: None,
        };
        assert_eq!(
            namespace(&[f]),
            "## functions\n\nnamespace functions {\n\ntype ping = () => any;\n\n} // namespace functions"
        );
    }
}
