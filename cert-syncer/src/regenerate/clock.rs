//! The apiserver's clock, for the clock check of each pass (see the module docs of
//! `regenerate`).

use super::config::Rotation;
use super::decide;
use crate::base::error::chain;
use crate::base::time::rfc3339;

/// The time one pass decides at, and the apiserver's clock it was checked against: the local
/// clock (`local`), but never later than the apiserver's (see `decide::trusted_now`). A local
/// clock ahead of the apiserver's by more than the backdate margin is logged: expiry is then
/// judged at the apiserver's time, so a jump forward destroys nothing still valid there.
pub(super) async fn clocks(
    client: &kube::Client,
    rotation: &Rotation,
    local: i64,
) -> (i64, Option<i64>) {
    let apiserver = apiserver_time(client).await;
    if let Some(at) = apiserver
        && local - at > rotation.backdate.as_secs() as i64
    {
        tracing::warn!(
            local = %rfc3339(local),
            apiserver = %rfc3339(at),
            ahead_seconds = local - at,
            "the local clock is ahead of the apiserver's: expiry and generation use the apiserver's time"
        );
    }
    (decide::trusted_now(local, apiserver), apiserver)
}

/// The apiserver's clock: the `Date` of its answer to `GET /version` (public information every
/// client may read: no permission, no object read; any answer, an error too, carries a `Date`).
/// `None` if it does not answer or sends no usable `Date`: the caller then falls back to the
/// local clock alone.
async fn apiserver_time(client: &kube::Client) -> Option<i64> {
    use http_body_util::BodyExt;
    let request = http::Request::get("/version")
        .body(kube::client::Body::from(Vec::new()))
        .ok()?;
    let response = client
        .send(request)
        .await
        .map_err(|err| tracing::warn!(error = %chain(&err), "cannot read the apiserver's clock; using the local clock alone"))
        .ok()?;
    let date = response.headers().get(http::header::DATE).cloned();
    // Drain the body so the connection can be reused; its content is not needed.
    let _ = response.into_body().collect().await;
    let date = date?;
    parse_http_date(date.to_str().ok()?)
}

/// An HTTP `Date` (`Sun, 06 Nov 1994 08:49:37 GMT`, RFC 9110 IMF-fixdate) as Unix seconds.
fn parse_http_date(text: &str) -> Option<i64> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let [_weekday, day, month, year, clock, "GMT"] =
        text.split_ascii_whitespace().collect::<Vec<_>>()[..]
    else {
        return None;
    };
    let month = MONTHS.iter().position(|m| *m == month)? as u8 + 1;
    let date = time::Date::from_calendar_date(
        year.parse().ok()?,
        time::Month::try_from(month).ok()?,
        day.parse().ok()?,
    )
    .ok()?;
    let mut parts = clock.split(':').map(str::parse::<u8>);
    let (Some(Ok(hour)), Some(Ok(minute)), Some(Ok(second)), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let at = time::Time::from_hms(hour, minute, second).ok()?;
    Some(date.with_time(at).assume_utc().unix_timestamp())
}

#[cfg(test)]
mod tests {
    use super::parse_http_date;

    #[test]
    fn http_dates_parse_and_anything_else_is_none() {
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 CET"), None);
        assert_eq!(parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"), None);
        assert_eq!(parse_http_date(""), None);
    }
}
