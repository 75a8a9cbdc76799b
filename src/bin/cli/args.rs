//! What the subcommands share about their arguments: usage errors that name the option the user
//! typed, and the subcommands that take no argument but `--help`.

use std::ffi::OsString;

/// One line explaining `e`, naming the option or argument as it was typed.
pub fn explain(e: lexopt::Error) -> String {
    use lexopt::Error;
    match e {
        Error::MissingValue { option: Some(o) } => format!("option `{o}` needs a value"),
        Error::MissingValue { option: None } => "a value is missing".to_owned(),
        Error::UnexpectedOption(o) => format!("unknown option `{o}`"),
        Error::UnexpectedArgument(a) => format!("unexpected argument `{}`", a.to_string_lossy()),
        Error::UnexpectedValue { option, value } => format!(
            "option `{option}` takes no value (got `{}`)",
            value.to_string_lossy()
        ),
        other => other.to_string(),
    }
}

/// Print a usage error of `cuhook SUB` (`sub` empty for the top level) and return the usage
/// exit status.
pub fn usage_error(program: &str, sub: &str, e: lexopt::Error) -> i32 {
    let full = if sub.is_empty() {
        program.to_owned()
    } else {
        format!("{program} {sub}")
    };
    eprintln!("{full}: {}. Try `{full} --help`.", explain(e));
    super::USAGE_ERROR
}

/// The options of `cuhook SUB` as its parser read them: `Ok(options)` to go on, or `Err(status)`
/// once the help was printed (`Ok(None)` from the parser: 0) or a usage error reported.
pub fn options_or_exit<T>(
    parsed: Result<Option<T>, lexopt::Error>,
    sub: &str,
    help: &str,
) -> Result<T, i32> {
    match parsed {
        Ok(Some(options)) => Ok(options),
        Ok(None) => {
            print!("{help}");
            Err(0)
        }
        Err(e) => Err(usage_error("cuhook", sub, e)),
    }
}

/// For a subcommand that takes no argument: `Ok(true)` when `--help` was asked for,
/// `Ok(false)` when there was nothing, the first stray argument or option otherwise.
pub fn only_help(args: Vec<OsString>) -> Result<bool, lexopt::Error> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    match p.next()? {
        None => Ok(false),
        Some(Long("help") | Short('h')) => Ok(true),
        Some(other) => Err(other.unexpected()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_error(args: &[&str]) -> String {
        use lexopt::prelude::*;
        let mut p = lexopt::Parser::from_args(args.iter().map(OsString::from));
        loop {
            match p.next() {
                Ok(Some(Long("report"))) => {
                    if let Err(e) = p.value() {
                        return explain(e);
                    }
                }
                Ok(Some(Long("help"))) => {}
                Ok(Some(other)) => return explain(other.unexpected()),
                Ok(None) => return String::new(),
                Err(e) => return explain(e),
            }
        }
    }

    #[test]
    fn errors_name_what_was_typed() {
        assert_eq!(
            first_error(&["--report"]),
            "option `--report` needs a value"
        );
        assert_eq!(first_error(&["--bogus=1"]), "unknown option `--bogus`");
        assert_eq!(first_error(&["-x"]), "unknown option `-x`");
        assert_eq!(first_error(&["extra"]), "unexpected argument `extra`");
        assert_eq!(
            first_error(&["--help=yes"]),
            "option `--help` takes no value (got `yes`)"
        );
        assert_eq!(first_error(&["--report=r.txt"]), "");
    }

    #[test]
    fn only_help_refuses_anything_else() {
        assert!(!only_help(vec![]).unwrap());
        assert!(only_help(vec!["-h".into()]).unwrap());
        assert_eq!(
            explain(only_help(vec!["extra".into()]).unwrap_err()),
            "unexpected argument `extra`"
        );
    }
}
