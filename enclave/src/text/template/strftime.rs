//! `strftime_now`: the UTC calendar and the strftime directives templates
//! use, on the clock the render was given.

use super::*;

/// A UTC calendar time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CivilTime {
    pub(super) year: i64,
    /// 1..=12
    pub(super) month: u32,
    /// 1..=31
    pub(super) day: u32,
    pub(super) hour: u32,
    pub(super) minute: u32,
    pub(super) second: u32,
    /// 0 = Sunday, as `%w`.
    pub(super) weekday: u32,
    /// 1..=366
    pub(super) yday: u32,
}

impl CivilTime {
    pub(super) fn from_system(t: SystemTime) -> Self {
        // A clock before 1970 reads as 1970: nothing here predates it.
        let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
        let rem = (secs % 86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        let yday = (days - days_from_civil(year, 1, 1)) as u32 + 1;
        Self {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem % 3600 / 60,
            second: rem % 60,
            // 1970-01-01 was a Thursday (4).
            weekday: (days + 4).rem_euclid(7) as u32,
            yday,
        }
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (H. Hinnant's `civil_from_days`).
pub(super) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) to days since 1970-01-01 (`days_from_civil`).
pub(super) fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

pub(super) const WEEKDAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
pub(super) const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Python's `datetime.strftime` in the C locale for a naive time, for the
/// directives chat templates use; any other is refused by name.
pub(super) fn strftime(t: &CivilTime, format: &str) -> Result<String, minijinja::Error> {
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // glibc's `%-d`: no padding.
        let mut directive = chars.next();
        let pad = directive != Some('-');
        if !pad {
            directive = chars.next();
        }
        let num = |out: &mut String, n: u32, width: usize| {
            let _ = if pad { write!(out, "{n:0width$}") } else { write!(out, "{n}") };
        };
        let weekday = WEEKDAYS[t.weekday as usize % 7];
        let month = MONTHS[(t.month as usize + 11) % 12];
        match directive {
            Some('Y') => {
                let _ = write!(out, "{}", t.year);
            }
            Some('y') => num(&mut out, t.year.rem_euclid(100) as u32, 2),
            Some('m') => num(&mut out, t.month, 2),
            Some('d') => num(&mut out, t.day, 2),
            Some('e') => {
                let _ = write!(out, "{:2}", t.day);
            }
            Some('j') => num(&mut out, t.yday, 3),
            Some('H') => num(&mut out, t.hour, 2),
            Some('I') => num(&mut out, (t.hour + 11) % 12 + 1, 2),
            Some('M') => num(&mut out, t.minute, 2),
            Some('S') => num(&mut out, t.second, 2),
            Some('p') => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('b') | Some('h') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('w') => num(&mut out, t.weekday, 1),
            // A naive datetime has no zone: Python writes nothing.
            Some('z') | Some('Z') => {}
            Some('%') => out.push('%'),
            Some(other) => return Err(unsupported(format!("strftime directive %{other}"))),
            None => return Err(unsupported("strftime format ending in %".into())),
        }
    }
    Ok(out)
}
