/* log.h - cudefer's messages.
 *
 * Messages go to the file that was the process's stderr when cudefer was
 * loaded (a duplicate of that descriptor), never to whatever the program
 * later opens as descriptor 2; when that file is gone, they are dropped.
 * Formatting uses a stack buffer: no allocation, and a message made while
 * one is being written (a signal, a recursion) is dropped.
 */
#ifndef CUDEFER_LOG_H
#define CUDEFER_LOG_H

enum cd_log_level { CD_LOG_OFF, CD_LOG_ERROR, CD_LOG_INFO, CD_LOG_DEBUG };

/* The level below which messages are written (CUDEFER_LOG, set by the
 * options once they are read; CD_LOG_ERROR until then). */
void cd_log_set_level(enum cd_log_level level);
enum cd_log_level cd_log_level(void);

/* "cudefer: " + message + newline, when level <= the current level. */
void cd_log(enum cd_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The message as given, whatever the level (warnings about the options,
 * the statistics table). */
void cd_log_raw(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Takes a new duplicate of the current stderr (a forked child keeps its
 * parent's; a test calls this after redirecting stderr). */
void cd_log_reopen(void);

#endif
