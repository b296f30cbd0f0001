//! [`Placeholders`]: how a dialect names a statement's parameters, and the spelling of a
//! statement written with `$1`, `$2`… in it.

/// How a dialect names a statement's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholders {
    /// `$1`, `$2`…, each naming the value bound in that place, as often as it likes:
    /// PostgreSQL.
    Dollar,
    /// `?1`, `?2`…, the same, in SQLite's own spelling (which sqlx and rusqlite both
    /// bind by number; `$1` would be a *named* parameter to SQLite).
    Numbered,
    /// `?`, each taking the next value bound: MySQL and MariaDB. A statement names
    /// each value once, in the order bound.
    Positional,
}

impl Placeholders {
    /// `template`, whose parameters are `$1`, `$2`…, in this spelling. A `$` in a
    /// quoted literal or identifier, or not followed by a digit (PostgreSQL's `$$`), is
    /// left as it is.
    ///
    /// # Panics
    ///
    /// For [`Positional`](Self::Positional), when `template` does not use `$1`, `$2`…
    /// once each and in order.
    pub fn render(self, template: &str) -> String {
        if self == Placeholders::Dollar {
            return template.to_owned();
        }
        let mut out = String::with_capacity(template.len());
        let mut quote = None;
        let mut next = 1;
        let mut rest = template;
        while let Some(c) = rest.chars().next() {
            rest = &rest[c.len_utf8()..];
            match (quote, c) {
                (Some(q), _) if c == q => quote = None,
                (None, '\'' | '"' | '`') => quote = Some(c),
                (None, '$') if rest.starts_with(|d: char| d.is_ascii_digit()) => {
                    let digits = rest
                        .find(|d: char| !d.is_ascii_digit())
                        .unwrap_or(rest.len());
                    let (number, after) = rest.split_at(digits);
                    rest = after;
                    if self == Placeholders::Positional {
                        assert!(
                            number.parse() == Ok(next),
                            "${number} where ${next} was due: a statement for positional \
                             parameters uses each once, in order: {template}"
                        );
                        next += 1;
                        out.push('?');
                    } else {
                        out.push('?');
                        out.push_str(number);
                    }
                    continue;
                }
                _ => {}
            }
            out.push(c);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Placeholders::{Dollar, Numbered, Positional};

    const TEMPLATE: &str =
        "UPDATE t SET a = $1, b = '$2 stays', \"c$3\" = $2 WHERE d = $3 AND e = $$";

    #[test]
    fn numbered_keeps_the_numbers_outside_quotes() {
        assert_eq!(Dollar.render(TEMPLATE), TEMPLATE);
        assert_eq!(
            Numbered.render(TEMPLATE),
            "UPDATE t SET a = ?1, b = '$2 stays', \"c$3\" = ?2 WHERE d = ?3 AND e = $$"
        );
        assert_eq!(Numbered.render("LIMIT $10)"), "LIMIT ?10)");
    }

    #[test]
    fn positional_takes_each_parameter_once_in_order() {
        assert_eq!(
            Positional.render(TEMPLATE),
            "UPDATE t SET a = ?, b = '$2 stays', \"c$3\" = ? WHERE d = ? AND e = $$"
        );
    }

    #[test]
    #[should_panic(expected = "$2 where $1 was due")]
    fn positional_refuses_parameters_out_of_order() {
        Positional.render("UPDATE t SET a = $2 WHERE b = $1");
    }

    #[test]
    #[should_panic(expected = "$1 where $2 was due")]
    fn positional_refuses_a_parameter_used_twice() {
        Positional.render("VALUES ($1, $1)");
    }
}
