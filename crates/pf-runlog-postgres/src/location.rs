//! Where a PostgreSQL run log lives: `postgres://USER@HOST:PORT/DB`, its
//! password from `PGPASSWORD` or from the variable the URL's
//! `password_env=NAME` names, never from the URL itself when it came from a
//! host file.

use std::time::Duration;

/// Where the URL came from: a host file may not hold a password (host files
/// are shared and checked in; a password belongs in the environment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlSource {
    /// The host file's `[runlog] url`.
    HostFile,
    /// `PROMPTFORGE_RUNLOG_URL` (the environment may carry a secret).
    Environment,
}

/// Why a run log URL cannot be used. The message names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocationError {
    #[error("`{url}` is not a URL: {detail}")]
    NotAUrl { url: String, detail: String },
    #[error("`{shown}`: the run log URL must start with postgres:// or postgresql://")]
    Scheme { shown: String },
    #[error("`{shown}`: a password does not belong in the host file; set PGPASSWORD, or name a variable that holds it with `?password_env=NAME`")]
    PasswordInHostFile { shown: String },
    #[error("`{shown}`: name the database (postgres://USER@HOST:PORT/DB)")]
    NoDatabase { shown: String },
    #[error("`{shown}`: name the host (postgres://USER@HOST:PORT/DB)")]
    NoHost { shown: String },
    #[error("`{shown}`: password_env names {name}, which is not set")]
    PasswordEnvUnset { shown: String, name: String },
    #[error("`{shown}`: unknown parameter `{name}` (known: password_env, connect_timeout, application_name)")]
    UnknownParameter { shown: String, name: String },
    #[error("`{shown}`: connect_timeout must be a whole number of seconds, got `{value}`")]
    BadTimeout { shown: String, value: String },
}

/// A checked PostgreSQL location.
#[derive(Clone, PartialEq, Eq)]
pub struct PgLocation {
    /// The URL as messages show it: no password, no parameters.
    shown: String,
    user: String,
    host: String,
    port: u16,
    dbname: String,
    password: Option<String>,
    connect_timeout: Duration,
    application_name: String,
}

impl std::fmt::Debug for PgLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("PgLocation")
            .field("url", &self.shown)
            .finish_non_exhaustive()
    }
}

/// Whether `url` names a PostgreSQL log (as opposed to a mistake): the
/// scheme alone decides.
pub fn is_postgres_url(url: &str) -> bool {
    let lower = url.trim().to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

impl PgLocation {
    /// Check `url`; `env` reads a variable (the process environment in use,
    /// a map in tests).
    pub fn parse(
        url: &str,
        source: UrlSource,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<PgLocation, LocationError> {
        let parsed = url::Url::parse(url.trim()).map_err(|err| LocationError::NotAUrl {
            url: redact(url),
            detail: err.to_string(),
        })?;
        let user = percent_decode(parsed.username());
        let host = parsed.host_str().unwrap_or_default().to_owned();
        let port = parsed.port().unwrap_or(5432);
        let dbname = percent_decode(parsed.path().trim_start_matches('/'));
        let user_part = if user.is_empty() {
            String::new()
        } else {
            format!("{user}@")
        };
        let shown = format!("postgres://{user_part}{host}:{port}/{dbname}");
        if !matches!(parsed.scheme(), "postgres" | "postgresql") {
            return Err(LocationError::Scheme { shown: redact(url) });
        }
        if host.is_empty() {
            return Err(LocationError::NoHost { shown });
        }
        if dbname.is_empty() {
            return Err(LocationError::NoDatabase { shown });
        }
        let inline = parsed.password().map(percent_decode);
        if inline.is_some() && source == UrlSource::HostFile {
            return Err(LocationError::PasswordInHostFile { shown });
        }
        let mut password_env = None;
        let mut connect_timeout = Duration::from_secs(10);
        let mut application_name = "promptforge".to_owned();
        for (name, value) in parsed.query_pairs() {
            match name.as_ref() {
                "password_env" => password_env = Some(value.into_owned()),
                "connect_timeout" => {
                    let seconds = value
                        .parse::<u64>()
                        .map_err(|_| LocationError::BadTimeout {
                            shown: shown.clone(),
                            value: value.to_string(),
                        })?;
                    connect_timeout = Duration::from_secs(seconds.max(1));
                }
                "application_name" => application_name = value.into_owned(),
                other => {
                    return Err(LocationError::UnknownParameter {
                        shown,
                        name: other.to_owned(),
                    })
                }
            }
        }
        let password = match password_env {
            Some(name) => Some(env(&name).ok_or_else(|| LocationError::PasswordEnvUnset {
                shown: shown.clone(),
                name: name.clone(),
            })?),
            None => inline.or_else(|| env("PGPASSWORD").filter(|p| !p.is_empty())),
        };
        let user = if user.is_empty() {
            env("PGUSER")
                .or_else(|| env("USER"))
                .unwrap_or_else(|| "postgres".to_owned())
        } else {
            user
        };
        Ok(PgLocation {
            shown,
            user,
            host,
            port,
            dbname,
            password,
            connect_timeout,
            application_name,
        })
    }

    /// The URL as messages show it (never the password).
    pub fn shown(&self) -> &str {
        &self.shown
    }

    pub(crate) fn client_config(&self) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .user(&self.user)
            .host(&self.host)
            .port(self.port)
            .dbname(&self.dbname)
            .connect_timeout(self.connect_timeout)
            .application_name(&self.application_name);
        if let Some(password) = &self.password {
            config.password(password);
        }
        config
    }
}

fn percent_decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("x={text}").as_bytes())
        .next()
        .map(|(_, value)| value.into_owned())
        .unwrap_or_else(|| text.to_owned())
}

/// `url` with anything between `://` and `@` that has a `:` cut down to the
/// user, for a message about a URL that did not parse.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(not shown)".to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}@{host}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn a_plain_url_is_read_and_shown_without_parameters() {
        let at = PgLocation::parse(
            "postgres://pf@db.example:6543/runs?application_name=w1",
            UrlSource::HostFile,
            &none,
        )
        .unwrap();
        assert_eq!(at.shown(), "postgres://pf@db.example:6543/runs");
        assert_eq!(at.password, None);
        assert_eq!(at.application_name, "w1");
    }

    #[test]
    fn a_password_in_the_host_file_is_refused_and_never_shown() {
        let err = PgLocation::parse(
            "postgres://pf:hunter2@db:5432/runs",
            UrlSource::HostFile,
            &none,
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("PGPASSWORD"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        // The environment may carry one.
        let at = PgLocation::parse(
            "postgres://pf:hunter2@db:5432/runs",
            UrlSource::Environment,
            &none,
        )
        .unwrap();
        assert_eq!(at.password.as_deref(), Some("hunter2"));
        assert!(!format!("{at:?}").contains("hunter2"));
    }

    #[test]
    fn the_password_comes_from_pgpassword_or_the_named_variable() {
        let env = |name: &str| match name {
            "PGPASSWORD" => Some("from-pg".to_owned()),
            "RUNLOG_SECRET" => Some("from-named".to_owned()),
            _ => None,
        };
        let plain = PgLocation::parse("postgres://pf@db/runs", UrlSource::HostFile, &env).unwrap();
        assert_eq!(plain.password.as_deref(), Some("from-pg"));
        let named = PgLocation::parse(
            "postgres://pf@db/runs?password_env=RUNLOG_SECRET",
            UrlSource::HostFile,
            &env,
        )
        .unwrap();
        assert_eq!(named.password.as_deref(), Some("from-named"));
        let unset = PgLocation::parse(
            "postgres://pf@db/runs?password_env=MISSING",
            UrlSource::HostFile,
            &env,
        )
        .unwrap_err();
        assert!(unset.to_string().contains("MISSING"));
    }

    #[test]
    fn mistakes_name_the_fix() {
        for (url, says) in [
            ("mysql://pf@db/runs", "postgres://"),
            ("postgres://pf@db", "name the database"),
            (
                "postgres://pf@db/runs?sslmode=require",
                "unknown parameter `sslmode`",
            ),
            (
                "postgres://pf@db/runs?connect_timeout=soon",
                "connect_timeout",
            ),
        ] {
            let err = PgLocation::parse(url, UrlSource::HostFile, &none).unwrap_err();
            assert!(err.to_string().contains(says), "{url}: {err}");
        }
    }
}
